// Package metricstest checks metrics the way their readers meet them: a
// HELP text that says what each label means.
package metricstest

import (
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// A Desc's name, help and variable labels, read from its String form, the
// only way client_golang shows them.
var (
	descName   = regexp.MustCompile(`fqName: ("[^"]*")`)
	descHelp   = regexp.MustCompile(`help: ("(?:[^"\\]|\\.)*")`)
	descLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)
)

// Recorder is a Registerer that keeps what is registered with it, for
// HelpNamesLabels.
type Recorder struct {
	Collectors []prometheus.Collector
}

func (r *Recorder) Register(c prometheus.Collector) error {
	r.Collectors = append(r.Collectors, c)
	return nil
}

func (r *Recorder) MustRegister(cs ...prometheus.Collector) {
	r.Collectors = append(r.Collectors, cs...)
}

func (r *Recorder) Unregister(prometheus.Collector) bool { return false }

var wordPattern = regexp.MustCompile(`[A-Za-z0-9_]+`)

// HelpNamesLabels fails t for each metric of cs whose HELP text does not
// name each of its labels as a word (a metric by "worker" and "space"
// says "by worker and space"), or that has no HELP text.
func HelpNamesLabels(t testing.TB, cs ...prometheus.Collector) {
	t.Helper()
	ch := make(chan *prometheus.Desc)
	go func() {
		for _, c := range cs {
			c.Describe(ch)
		}
		close(ch)
	}()
	seen := 0
	for d := range ch {
		seen++
		name, help, labels, err := readDesc(d.String())
		if err != nil {
			t.Errorf("metric description %s: %v", d, err)
			continue
		}
		if strings.TrimSpace(help) == "" {
			t.Errorf("%s has no HELP text", name)
		}
		words := wordPattern.FindAllString(help, -1)
		for _, label := range strings.Split(labels, ",") {
			if label = strings.TrimSpace(label); label != "" && !slices.Contains(words, label) {
				t.Errorf("%s: HELP %q does not name its label %q", name, help, label)
			}
		}
	}
	if seen == 0 {
		t.Error("no metrics described")
	}
}

func readDesc(desc string) (name, help, labels string, err error) {
	n, h, l := descName.FindStringSubmatch(desc), descHelp.FindStringSubmatch(desc), descLabels.FindStringSubmatch(desc)
	if n == nil || h == nil || l == nil {
		return "", "", "", errors.New("not of the form this check reads")
	}
	if name, err = strconv.Unquote(n[1]); err != nil {
		return "", "", "", err
	}
	if help, err = strconv.Unquote(h[1]); err != nil {
		return "", "", "", err
	}
	return name, help, l[1], nil
}
