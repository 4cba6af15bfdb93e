package envd

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// The headers the SDK sends.
const (
	accessTokenHeader = "X-Access-Token"
	// keepaliveHeader asks a stream for an empty event every so many
	// seconds, so proxies do not close it while it is idle.
	keepaliveHeader = "Keepalive-Ping-Interval"
)

// authorize lets a request through when no access token is configured,
// when it carries the token, or (/files only) when its URL carries a
// signature made with the token. Anything else is answered 401, the way
// the SDK maps to its authentication error; /health is always open (the
// SDK probes it to tell a gone sandbox from a network failure).
func (s *Server) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.AccessToken == "" || r.URL.Path == "/health" || sameSecret(r.Header.Get(accessTokenHeader), s.cfg.AccessToken) {
			next.ServeHTTP(w, r)
			return
		}
		if r.URL.Path == "/files" && r.URL.Query().Get("signature") != "" {
			if err := s.checkSignature(r, time.Now()); err != nil {
				writeHTTPError(w, http.StatusUnauthorized, err)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		err := errors.New("the sandbox's access token is required (" + accessTokenHeader + ")")
		if r.Header.Get(accessTokenHeader) != "" {
			err = errors.New("the access token (" + accessTokenHeader + ") is not the sandbox's")
		}
		if r.URL.Path == "/files" {
			writeHTTPError(w, http.StatusUnauthorized, err)
			return
		}
		// A Connect error body: clients of every Connect protocol variant
		// read the code from it or from the status.
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusUnauthorized)
		json.NewEncoder(w).Encode(map[string]string{"code": connect.CodeUnauthenticated.String(), "message": err.Error()})
	})
}

func sameSecret(got, want string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// checkSignature accepts a /files URL signed for its path, operation
// (read for GET, write for POST) and user with the access token, the way
// the SDK's download and upload URLs are: "v1_" and the unpadded base64
// of SHA-256 over "path:operation:user:token", with ":expiration" (Unix
// seconds) appended when the URL carries signature_expiration, which must
// not have passed.
func (s *Server) checkSignature(r *http.Request, now time.Time) error {
	q := r.URL.Query()
	op := "read"
	if r.Method == http.MethodPost {
		op = "write"
	}
	raw := q.Get("path") + ":" + op + ":" + q.Get("username") + ":" + s.cfg.AccessToken
	if exp := q.Get("signature_expiration"); exp != "" {
		secs, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return fmt.Errorf("signature_expiration %q: not Unix seconds", exp)
		}
		if now.Unix() > secs {
			return errors.New("the URL's signature expired")
		}
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	if !sameSecret(q.Get("signature"), want) {
		return errors.New("the URL's signature is not valid for this path, operation and user")
	}
	return nil
}

// basicUser is the user an Authorization header names ("Basic" with
// base64 "name:"); empty without one.
func basicUser(h http.Header) (string, error) {
	v := h.Get("Authorization")
	if v == "" {
		return "", nil
	}
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("authorization: want Basic with the user's name"))
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("authorization: %w", err))
	}
	name, _, _ := strings.Cut(string(b), ":")
	return name, nil
}

// writeHTTPError answers a plain HTTP call with a JSON {code, message}
// body, the shape the SDK reads a message from.
func writeHTTPError(w http.ResponseWriter, status int, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, err.Error()})
}
