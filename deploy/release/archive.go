package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// archiveFile is one regular file of an archive.
type archiveFile struct {
	name string
	mode int64
	body []byte
}

// tarGz writes files, in the order given, as a gzip-compressed tar that depends on nothing
// but its arguments: every entry has the epoch as its time, root as its owner, the PAX format;
// the gzip header has no name and no time. header, when not nil, gives the gzip header's
// Extra and Comment (helm's marks on a chart).
func tarGz(epoch time.Time, header *gzip.Header, files []archiveFile) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if header != nil {
		zw.Extra, zw.Comment = header.Extra, header.Comment
	}
	tw := tar.NewWriter(zw)
	for _, f := range files {
		h := &tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.body)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		if _, err := tw.Write(f.body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// retime rewrites a gzip-compressed tar of regular files (a chart helm packaged) with tarGz:
// the same files in the same order, with the epoch in place of helm's time of packaging. edit,
// when not nil, may change a file's content (a packaged chart's values).
func retime(tgz []byte, epoch time.Time, edit func(name string, body []byte) ([]byte, error)) ([]byte, error) {
	var header gzip.Header
	var files []archiveFile
	err := walkTgzHeader(tgz, &header, func(h *tar.Header, body []byte) error {
		if edit != nil {
			var err error
			if body, err = edit(h.Name, body); err != nil {
				return fmt.Errorf("%s: %w", h.Name, err)
			}
		}
		files = append(files, archiveFile{name: h.Name, mode: h.Mode, body: body})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return tarGz(epoch, &header, files)
}

// walkTgz calls fn with each file of a gzip-compressed tar of regular files, in order.
func walkTgz(tgz []byte, fn func(name string, body []byte) error) error {
	return walkTgzHeader(tgz, nil, func(h *tar.Header, body []byte) error { return fn(h.Name, body) })
}

// walkTgzHeader is walkTgz with each entry's tar header, and the gzip header into header when
// not nil. An entry other than a regular file is an error.
func walkTgzHeader(tgz []byte, header *gzip.Header, fn func(h *tar.Header, body []byte) error) error {
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		return err
	}
	if header != nil {
		*header = zr.Header
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return fmt.Errorf("%s: entry of type %q, want only regular files", h.Name, h.Typeflag)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		if err := fn(h, body); err != nil {
			return err
		}
	}
}

// checksums is SHA256SUMS of every regular file under fsys but itself and the signature and
// key written after it, in the format `sha256sum -c` reads (hash, two spaces, slash-separated
// path), sorted by path.
func checksums(fsys fs.FS) ([]byte, error) {
	var buf bytes.Buffer
	err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || unsummed(path) {
			return err
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s is not a regular file", path)
		}
		f, err := fsys.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		fmt.Fprintf(&buf, "%x  %s\n", h.Sum(nil), path)
		return nil
	})
	return buf.Bytes(), err // fs.WalkDir walks in lexical order
}

// listing prints the files at the top of dir with their sizes (the image layout as one line,
// its total).
func listing(w io.Writer, dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		var size int64
		err := filepath.WalkDir(filepath.Join(dir, e.Name()), func(_ string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			size += fi.Size()
			return nil
		})
		if err != nil {
			return err
		}
		name := e.Name()
		if e.IsDir() {
			name += "/"
		}
		fmt.Fprintf(w, "%12d  %s\n", size, name)
	}
	return nil
}
