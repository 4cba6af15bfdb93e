package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
	"github.com/torpor-dev/torpor/api/gen/torpor/v1/torporv1connect"
)

// TestUnknownJSONFieldRefused: a JSON request with a field the API does not
// know is refused naming it, whatever the JSON content type; the same
// request without it, and a binary request carrying an unknown field, are
// served.
func TestUnknownJSONFieldRefused(t *testing.T) {
	r := startReplica(t, "sqlite:"+filepath.Join(t.TempDir(), "t.db"), io.Discard)
	hc := r.admin(t)
	url := r.url + torporv1connect.SpaceServiceGetSpaceProcedure
	post := func(contentType string, body []byte) (int, []byte) {
		t.Helper()
		resp, err := hc.Post(url, contentType, bytes.NewReader(body))
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

	for _, ct := range []string{"application/json", "application/json; charset=utf-8"} {
		t.Run(ct, func(t *testing.T) {
			status, body := post(ct, []byte(`{"name": "default", "nmae": "other"}`))
			var e struct{ Code, Message string }
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("%d %q: %v", status, body, err)
			}
			if status != http.StatusBadRequest || e.Code != "invalid_argument" || !strings.Contains(e.Message, `unknown field "nmae"`) {
				t.Fatalf("got %d %s, want 400 invalid_argument naming the field nmae", status, body)
			}
			if status, body := post(ct, []byte(`{"name": "default"}`)); status != http.StatusOK {
				t.Fatalf("known fields only: %d %s", status, body)
			}
		})
	}
	t.Run("binary", func(t *testing.T) {
		msg, err := proto.Marshal(&torporv1.GetRequest{Name: "default"})
		if err != nil {
			t.Fatal(err)
		}
		msg = protowire.AppendTag(msg, 9999, protowire.VarintType)
		msg = protowire.AppendVarint(msg, 1)
		if status, body := post("application/proto", msg); status != http.StatusOK {
			t.Fatalf("binary request with an unknown field: %d %s, want it served", status, body)
		}
	})
}
