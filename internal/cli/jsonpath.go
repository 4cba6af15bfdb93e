package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"

	"k8s.io/client-go/util/jsonpath"
)

// parseJSONPath reads -o jsonpath=TEMPLATE as kubectl does.
func parseJSONPath(template string) (*jsonpath.JSONPath, error) {
	jp := jsonpath.New("output")
	if err := jp.Parse(template); err != nil {
		return nil, fmt.Errorf("-o jsonpath=%s: %w", template, err)
	}
	return jp, nil
}

// printJSONPath writes template applied to doc, a JSON document (an
// object, or a listing's {"items": [...]}), ending with a newline unless
// it wrote nothing.
func printJSONPath(w io.Writer, template string, doc []byte) error {
	jp, err := parseJSONPath(template)
	if err != nil {
		return err
	}
	var data any
	if err := json.Unmarshal(doc, &data); err != nil {
		return fmt.Errorf("-o jsonpath: %w", err)
	}
	results, err := jp.FindResults(data)
	if err != nil {
		return fmt.Errorf("-o jsonpath=%s: %w", template, err)
	}
	var out bytes.Buffer
	for _, r := range results {
		if err := jp.PrintResults(&out, r); err != nil {
			return err
		}
	}
	if out.Len() > 0 && !bytes.HasSuffix(out.Bytes(), []byte("\n")) {
		out.WriteByte('\n')
	}
	_, err = out.WriteTo(w)
	return err
}
