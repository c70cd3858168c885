package middleware

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
)

// Issue 18: a key field spelled the Go way or the JSON way fails at start-up with the field the
// template needs and the fields the request has, as one line, without a stack trace.
func TestKeyFieldErrorsTeach(t *testing.T) {
	const method = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo" // request: ServerReflectionRequest
	for _, c := range []struct{ key, want string }{
		{"f:{FileByFilename}", "did you mean {file_by_filename}?"},
		{"f:{fileByFilename}", "did you mean {file_by_filename}?"},
		{"f:{nothing_like_it}", "key templates name fields by their proto names: host, file_by_filename"},
	} {
		_, err := New(LockConf{Rules: []Rule{{RPC: method, Key: c.key}}})
		if err == nil || !strings.Contains(err.Error(), "Lock.Rules[0].Key:") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("key %s: %v, want an error naming Lock.Rules[0].Key and %q", c.key, err, c.want)
		}
	}
}

// MustNew on a bad config: one line on stderr naming the field, exit status 1, no stack trace.
func TestMustNewExitsWithOneLine(t *testing.T) {
	code := -1
	exit = func(c int) { code = c }
	defer func() { exit = os.Exit }()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	MustNew(LockConf{Rules: []Rule{{Method: "POST", Path: "/x", Key: "x:{path.id}", OnBusy: "queue"}}})
	os.Stderr = stderr
	_ = w.Close()
	var out bytes.Buffer
	_, _ = io.Copy(&out, r)
	msg := out.String()
	if code != 1 {
		t.Errorf("exit status %d, want 1", code)
	}
	if strings.Count(strings.TrimSpace(msg), "\n") != 0 || !strings.Contains(msg, "Lock.Rules[0].OnBusy") || strings.Contains(msg, "goroutine") {
		t.Errorf("stderr %q, want one line naming Lock.Rules[0].OnBusy and no stack trace", msg)
	}
}
