package record

import (
	"bytes"
	"encoding/json"
	"sync"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"
)

// Headers returns nc's records without their event bodies, for the readers that decide from
// a record's state, kind, hold and times: the pacer's count of impaired instances, the
// deferral controller's index and its releases, status. A paced pool's records are read at
// every drain that ends and every refresh of the pool; decoded headers are kept per
// annotation value, so each value is decoded once, not once per read (the bulk event of the
// live bench spent a third of the router's CPU decoding the same records again). The slice
// is shared: callers must not modify it. Records that cannot be read are none, as Records.
func Headers(nc *karpv1.NodeClaim) []Record {
	if nc == nil {
		return nil
	}
	v := nc.Annotations[Annotation]
	if v == "" {
		return nil
	}
	return headers.get(v)
}

// headerCacheBytes bounds the annotation values the header cache keeps as keys. The values
// are mostly the strings the informer's cache holds already; what the bound limits is the
// stale ones, kept until the cache is cleared.
var headerCacheBytes = 16 << 20

var headers = &headerCache{m: map[string][]Record{}}

type headerCache struct {
	mu    sync.Mutex
	m     map[string][]Record
	bytes int
}

func (c *headerCache) get(v string) []Record {
	c.mu.Lock()
	rs, ok := c.m[v]
	c.mu.Unlock()
	if ok {
		return rs
	}
	rs = decodeHeaders(v)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.bytes+len(v) > headerCacheBytes {
		clear(c.m) // cheaper than tracking age, and rare: a pool's values fit many times over
		c.bytes = 0
	}
	if _, ok := c.m[v]; !ok {
		c.m[v] = rs
		c.bytes += len(v)
	}
	return rs
}

// headerOnly decodes a record and skips its event body (the outer field wins over the
// embedded one of the same name).
type headerOnly struct {
	Record
	Event struct{} `json:"event,omitzero"`
}

// decodeHeaders decodes v as Decode does, in one pass and without the event bodies; an
// unreadable value is no records.
func decodeHeaders(v string) []Record {
	raw := bytes.TrimSpace([]byte(v))
	var hs []headerOnly
	switch {
	case len(raw) == 0:
		return nil
	case raw[0] == '[':
		if json.Unmarshal(raw, &hs) != nil {
			return nil
		}
	case raw[0] == '{':
		var e struct {
			Version int          `json:"version"`
			Records []headerOnly `json:"records"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Version < 2 || e.Version > Version {
			return nil
		}
		hs = e.Records
	default:
		return nil
	}
	out := make([]Record, len(hs))
	for i := range hs {
		out[i] = hs[i].Record
	}
	return out
}
