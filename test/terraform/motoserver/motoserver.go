// Package motoserver starts a moto_server (a local fake of the AWS APIs: SQS, EventBridge, EC2,
// CloudWatch, IAM, STS, Lambda) for one test, on a free loopback port, and stops it when the
// test ends.
package motoserver

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/schemas"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"
)

// Region is the region every client of the server uses.
const Region = "us-east-1"

// readyTimeout bounds moto's start-up (about a second on an idle machine).
const readyTimeout = 60 * time.Second

// Server is a running moto_server.
type Server struct {
	// Endpoint is the server's base URL, for the clients' BaseEndpoint.
	Endpoint string
	// Config is an AWS config with static test credentials and Region.
	Config aws.Config
}

// Binary returns the moto_server path, or "" when it is not installed.
func Binary() string {
	if p := os.Getenv("MOTO_SERVER"); p != "" {
		return p
	}
	if p, err := exec.LookPath("moto_server"); err == nil {
		return p
	}
	for _, p := range []string{"/root/.pyenv/shims/moto_server", "/usr/local/bin/moto_server"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// Start runs moto_server for t, skipping t loudly when moto is not installed.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		t.Skip("SKIPPED LOUDLY: moto_server is not installed (pip install 'moto[server]'); the AWS-side tests did not run")
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("finding a free port: %v", err)
	}
	logPath := filepath.Join(t.TempDir(), "moto.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-H", "127.0.0.1", "-p", fmt.Sprint(port))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil && len(b) > 0 {
				t.Logf("moto_server log (last 4 KiB):\n%s", tail(b, 4096))
			}
		}
	})

	endpoint := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(readyTimeout)
	for {
		resp, err := http.Get(endpoint + "/moto-api/")
		if err == nil {
			_ = resp.Body.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("moto_server exited before it was ready: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("moto_server not ready at %s after %s: %v", endpoint, readyTimeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}

	cfg, err := config.LoadDefaultConfig(context.Background(),
		config.WithRegion(Region),
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")),
		config.WithBaseEndpoint(endpoint),
	)
	if err != nil {
		t.Fatalf("AWS config for moto: %v", err)
	}
	return &Server{Endpoint: endpoint, Config: cfg}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// CloudWatchQuery makes a CloudWatch client speak awsQuery, which moto serves, instead of the
// SDK's default Smithy RPCv2 CBOR, which moto 5 answers with 404:
//
//	cloudwatch.NewFromConfig(srv.Config, motoserver.CloudWatchQuery)
func CloudWatchQuery(o *cloudwatch.Options) {
	o.Protocol = awsquery.New(schemas.GraniteServiceVersion20100801)
}
