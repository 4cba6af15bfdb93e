package envd

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"connectrpc.com/connect"

	pb "github.com/torpor-dev/torpor/api/gen/envd/process"
)

// filesURL is /files of d for path, with more query parameters.
func filesURL(d *daemon, path string, more ...string) string {
	q := url.Values{"path": {path}}
	for i := 0; i+1 < len(more); i += 2 {
		q.Set(more[i], more[i+1])
	}
	return d.url + "/files?" + q.Encode()
}

func do(t *testing.T, method, u, token, contentType string, body io.Reader, header ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set(accessTokenHeader, token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func TestFilesUploadDownload(t *testing.T) {
	d := startDaemon(t, Config{})
	dir := t.TempDir()
	big := make([]byte, 1<<20)
	rand.Read(big)

	// Multipart with two files named by their part's file name, as the
	// SDK's writeFiles sends them.
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	for name, data := range map[string][]byte{dir + "/deep/er/one.txt": []byte("one"), dir + "/big.bin": big} {
		fw, err := mw.CreateFormFile("file", name)
		if err != nil {
			t.Fatal(err)
		}
		fw.Write(data)
	}
	mw.Close()
	status, body := do(t, http.MethodPost, d.url+"/files", "", mw.FormDataContentType(), &form)
	if status != http.StatusOK {
		t.Fatalf("multipart upload: %d %s", status, body)
	}
	var written []uploaded
	if err := json.Unmarshal(body, &written); err != nil || len(written) != 2 {
		t.Fatalf("multipart upload answered %s (%v)", body, err)
	}
	for _, w := range written {
		if w.Type != "file" || w.Name == "" || w.Path == "" {
			t.Fatalf("uploaded entry %+v", w)
		}
	}
	status, got := do(t, http.MethodGet, filesURL(d, dir+"/big.bin"), "", "", nil)
	if status != http.StatusOK || sha256.Sum256(got) != sha256.Sum256(big) {
		t.Fatalf("download of the 1 MiB file: %d, %d bytes, digests differ", status, len(got))
	}

	// Octet-stream, plain and gzip.
	status, body = do(t, http.MethodPost, filesURL(d, dir+"/raw.txt"), "", "application/octet-stream", bytes.NewReader([]byte("raw bytes")))
	if status != http.StatusOK {
		t.Fatalf("octet-stream upload: %d %s", status, body)
	}
	if err := json.Unmarshal(body, &written); err != nil || len(written) != 1 || written[0].Path != dir+"/raw.txt" || written[0].Name != "raw.txt" {
		t.Fatalf("octet-stream upload answered %s (%v)", body, err)
	}
	var zipped bytes.Buffer
	zw := gzip.NewWriter(&zipped)
	zw.Write([]byte("unzipped"))
	zw.Close()
	status, body = do(t, http.MethodPost, filesURL(d, dir+"/z.txt"), "", "application/octet-stream", &zipped, "Content-Encoding", "gzip")
	if status != http.StatusOK {
		t.Fatalf("gzip upload: %d %s", status, body)
	}
	for path, want := range map[string]string{dir + "/deep/er/one.txt": "one", dir + "/raw.txt": "raw bytes", dir + "/z.txt": "unzipped"} {
		if status, got := do(t, http.MethodGet, filesURL(d, path), "", "", nil); status != http.StatusOK || string(got) != want {
			t.Fatalf("download %s: %d %q, want %q", path, status, got, want)
		}
	}

	for _, tc := range []struct {
		name   string
		u      string
		status int
	}{
		{"missing file", filesURL(d, dir+"/nothing"), http.StatusNotFound},
		{"a directory", filesURL(d, dir), http.StatusBadRequest},
		{"no path", d.url + "/files", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := do(t, http.MethodGet, tc.u, "", "", nil)
			var e struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if status != tc.status || json.Unmarshal(body, &e) != nil || e.Code != tc.status || e.Message == "" {
				t.Fatalf("%d %s, want %d with a {code, message} body", status, body, tc.status)
			}
		})
	}
}

func TestAccessToken(t *testing.T) {
	d := startDaemon(t, Config{AccessToken: testToken})
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/f", []byte("secret"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The daemon's clients send the token; one without it is refused.
	if _, err := d.process.List(t.Context(), connect.NewRequest(&pb.ListRequest{})); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"", "wrong"} {
		bare := processClient(d, token)
		_, err := bare.List(t.Context(), connect.NewRequest(&pb.ListRequest{}))
		wantCode(t, err, connect.CodeUnauthenticated)
		stream, err := bare.Start(t.Context(), connect.NewRequest(&pb.StartRequest{Process: shell("true")}))
		if err == nil {
			stream.Receive()
			err = stream.Err()
		}
		wantCode(t, err, connect.CodeUnauthenticated)
		if status, _ := do(t, http.MethodGet, filesURL(d, dir+"/f"), token, "", nil); status != http.StatusUnauthorized {
			t.Fatalf("download with token %q: %d, want 401", token, status)
		}
		if status, _ := do(t, http.MethodPost, filesURL(d, dir+"/g"), token, "application/octet-stream", bytes.NewReader(nil)); status != http.StatusUnauthorized {
			t.Fatalf("upload with token %q: %d, want 401", token, status)
		}
	}
	if status, _ := do(t, http.MethodGet, d.url+"/health", "", "", nil); status != http.StatusNoContent {
		t.Fatalf("health without a token: %d, want 204", status)
	}
	if status, got := do(t, http.MethodGet, filesURL(d, dir+"/f"), testToken, "", nil); status != http.StatusOK || string(got) != "secret" {
		t.Fatalf("download with the token: %d %q", status, got)
	}

	// Signed URLs, as the SDK's downloadUrl and uploadUrl make them.
	sign := func(path, op, user string, exp int64) []string {
		raw := path + ":" + op + ":" + user + ":" + testToken
		q := []string{}
		if exp != 0 {
			raw += ":" + strconv.FormatInt(exp, 10)
			q = append(q, "signature_expiration", strconv.FormatInt(exp, 10))
		}
		sum := sha256.Sum256([]byte(raw))
		return append(q, "signature", "v1_"+base64.RawStdEncoding.EncodeToString(sum[:]))
	}
	later, earlier := time.Now().Add(time.Hour).Unix(), time.Now().Add(-time.Minute).Unix()
	for _, tc := range []struct {
		name   string
		method string
		query  []string
		status int
	}{
		{"read", http.MethodGet, sign(dir+"/f", "read", "", 0), http.StatusOK},
		{"read before expiry", http.MethodGet, sign(dir+"/f", "read", "", later), http.StatusOK},
		{"read expired", http.MethodGet, sign(dir+"/f", "read", "", earlier), http.StatusUnauthorized},
		{"read signed for writing", http.MethodGet, sign(dir+"/f", "write", "", 0), http.StatusUnauthorized},
		{"read signed for another path", http.MethodGet, sign(dir+"/other", "read", "", 0), http.StatusUnauthorized},
		{"write", http.MethodPost, sign(dir+"/f", "write", "", 0), http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader
			ct := ""
			if tc.method == http.MethodPost {
				body, ct = bytes.NewReader([]byte("signed")), "application/octet-stream"
			}
			if status, got := do(t, tc.method, filesURL(d, dir+"/f", tc.query...), "", ct, body); status != tc.status {
				t.Fatalf("%d %s, want %d", status, got, tc.status)
			}
		})
	}
}
