package cli

import (
	"fmt"
	"strings"
)

// requirement is one term of a label selector: the label key, and the
// value it must have (or must not, with not); value-less terms ask only
// that the key be there (or absent, with not).
type requirement struct {
	key, value string
	hasValue   bool
	not        bool
}

// selector is -l's label selector, kubectl's equality subset: terms
// k=v (or k==v), k!=v, k and !k, joined by commas, all of which must hold.
type selector []requirement

func parseSelector(s string) (selector, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	var sel selector
	for term := range strings.SplitSeq(s, ",") {
		term = strings.TrimSpace(term)
		var r requirement
		switch {
		case strings.Contains(term, "!="):
			r.key, r.value, _ = strings.Cut(term, "!=")
			r.hasValue, r.not = true, true
		case strings.Contains(term, "="):
			r.key, r.value, _ = strings.Cut(term, "=")
			r.value = strings.TrimPrefix(r.value, "=")
			r.hasValue = true
		case strings.HasPrefix(term, "!"):
			r.key, r.not = term[1:], true
		default:
			r.key = term
		}
		r.key, r.value = strings.TrimSpace(r.key), strings.TrimSpace(r.value)
		if r.key == "" {
			return nil, fmt.Errorf("-l %q: %q has no label key (want k=v, k!=v, k or !k, joined by commas)", s, term)
		}
		sel = append(sel, r)
	}
	return sel, nil
}

func (sel selector) matches(labels map[string]string) bool {
	for _, r := range sel {
		v, ok := labels[r.key]
		if r.hasValue {
			ok = ok && v == r.value
		}
		if ok == r.not {
			return false
		}
	}
	return true
}

// filter keeps the items whose labels match.
func filter[T object](sel selector, items []T) []T {
	if len(sel) == 0 {
		return items
	}
	var out []T
	for _, item := range items {
		if sel.matches(item.GetMetadata().GetLabels()) {
			out = append(out, item)
		}
	}
	return out
}
