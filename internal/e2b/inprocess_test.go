package e2b

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestInProcessCalls: a handler in this process answers the client's calls,
// with the caller's deadline and cancellation and none of its context's
// values (what the API port's TLS layer learned of the E2B caller).
func TestInProcessCalls(t *testing.T) {
	type callerKey struct{}
	var sawValue any
	var sawBody string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawValue = r.Context().Value(callerKey{})
		b, _ := io.ReadAll(r.Body)
		sawBody = string(b)
		w.Header().Set("X-Answer", "yes")
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "answer")
	})
	ctx := context.WithValue(context.Background(), callerKey{}, "client certificate")
	req, err := http.NewRequestWithContext(ctx, "POST", InProcessURL+"/x", strings.NewReader("question"))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := InProcess(h).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot || string(body) != "answer" || resp.Header.Get("X-Answer") != "yes" {
		t.Errorf("answer %d %q %v", resp.StatusCode, body, resp.Header)
	}
	if sawBody != "question" {
		t.Errorf("handler read %q, want the request body", sawBody)
	}
	if sawValue != nil {
		t.Errorf("handler saw the caller's context value %v", sawValue)
	}

	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ = http.NewRequestWithContext(canceled, "GET", InProcessURL+"/x", nil)
	if _, err := InProcess(h).Do(req); !errors.Is(err, context.Canceled) {
		t.Errorf("a canceled call: %v, want context.Canceled", err)
	}
}
