package e2b

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

// maxListLimit is the largest page E2B's list gives (and its default).
const maxListLimit = 100

// maxRunningPages bounds the deprecated unpaged list (GET /sandboxes).
const maxRunningPages = 100

// get is GET /sandboxes/{id}: GetActor.
func (g *Gateway) get(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	a, err := g.getSandbox(ctx, c, id)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, g.detailOf(a))
	return nil
}

// listQuery is what a list asks, read from its query string.
type listQuery struct {
	labels       map[string]string
	states       []torporv1.ActorState
	limit        int32
	nextToken    string
	template     string
	startedAfter time.Time
}

// parseListQuery reads GET /v2/sandboxes's query: metadata ("k=v&k2=v2",
// each key and value URL-encoded once more), state (repeated, or
// comma-separated as the SDK sends it), limit, nextToken, template and
// startedAfter. order is refused: the API lists by sandbox ID, and
// ordering by start time across pages is not something a page can do.
func parseListQuery(q url.Values) (listQuery, error) {
	var lq listQuery
	var err error
	if lq.labels, err = parseMetadata(q.Get("metadata")); err != nil {
		return lq, err
	}
	for _, v := range q["state"] {
		for _, s := range strings.Split(v, ",") {
			states, ok := statesOf[s]
			if !ok {
				return lq, badRequest("state", "%q is not a sandbox state (running, paused)", s)
			}
			lq.states = append(lq.states, states...)
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return lq, badRequest("limit", "%q is not a number from 1 to %d", v, maxListLimit)
		}
		lq.limit = int32(n)
	}
	lq.nextToken = q.Get("nextToken")
	lq.template = q.Get("template")
	if v := q.Get("startedAfter"); v != "" {
		if lq.startedAfter, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return lq, badRequest("startedAfter", "%q is not an RFC 3339 time", v)
		}
	}
	if v := q.Get("order"); v != "" {
		return lq, badRequest("order", "not supported: sandboxes are listed by sandbox ID")
	}
	return lq, nil
}

// parseMetadata reads the metadata filter: a query string ("k=v&k2=v2")
// whose keys and values the SDK URL-encoded (encodeURIComponent) before
// it built the string, which it encoded once more as the parameter's
// value. A key or value that does not decode a second time is taken as
// it is: a client that encoded it only once.
func parseMetadata(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	pairs, err := url.ParseQuery(s)
	if err != nil {
		return nil, badRequest("metadata", "%q is not k=v&k2=v2: %v", s, err)
	}
	labels := map[string]string{}
	for k, vs := range pairs {
		key := unescapeOnce(k)
		for _, v := range vs {
			value := unescapeOnce(v)
			if prev, ok := labels[key]; ok && prev != value {
				return nil, badRequest("metadata", "%q is asked to be both %q and %q", key, prev, value)
			}
			labels[key] = value
		}
	}
	return labels, nil
}

func unescapeOnce(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// matches applies what the API cannot filter by: the template and the
// start time. A page may come out shorter than the limit; the next token
// still says whether there is more.
func (lq listQuery) matches(a *torporv1.Actor) bool {
	if !isSandbox(a) {
		return false
	}
	if lq.template != "" && a.GetSpec().GetTemplate() != lq.template {
		return false
	}
	if !lq.startedAfter.IsZero() && a.GetSpec().GetSandbox().GetStartTime().AsTime().Before(lq.startedAfter) {
		return false
	}
	return true
}

// list is GET /v2/sandboxes: a page of ListSandboxes, the next page's
// token in X-Next-Token.
func (g *Gateway) list(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	lq, err := parseListQuery(r.URL.Query())
	if err != nil {
		return err
	}
	limit := lq.limit
	if limit == 0 {
		limit = maxListLimit
	}
	resp, err := g.sandboxes.ListSandboxes(ctx, withKey(&torporv1.ListSandboxesRequest{
		Space: c.space, Labels: lq.labels, States: lq.states, PageSize: limit, PageToken: lq.nextToken,
	}, c.key))
	if err != nil {
		return err
	}
	items := []listedSandbox{}
	for _, a := range resp.Msg.GetActors() {
		if lq.matches(a) {
			items = append(items, listedOf(a))
		}
	}
	if next := resp.Msg.GetNextPageToken(); next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, items)
	return nil
}

// listRunning is the deprecated GET /sandboxes: every running sandbox,
// unpaged, with the metadata filter only.
func (g *Gateway) listRunning(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	labels, err := parseMetadata(r.URL.Query().Get("metadata"))
	if err != nil {
		return err
	}
	items := []listedSandbox{}
	token := ""
	for range maxRunningPages {
		resp, err := g.sandboxes.ListSandboxes(ctx, withKey(&torporv1.ListSandboxesRequest{
			Space: c.space, Labels: labels, States: statesOf[stateRunning], PageSize: maxListLimit, PageToken: token,
		}, c.key))
		if err != nil {
			return err
		}
		for _, a := range resp.Msg.GetActors() {
			if isSandbox(a) {
				items = append(items, listedOf(a))
			}
		}
		if token = resp.Msg.GetNextPageToken(); token == "" {
			writeJSON(w, http.StatusOK, items)
			return nil
		}
	}
	return badRequest("metadata", "more than %d running sandboxes match: narrow the filter or use GET /v2/sandboxes, which pages", maxRunningPages*maxListLimit)
}

// metrics is GET /sandboxes/{id}/metrics: one sample, now, from
// GetActorStats, when now is within the start and end asked (Unix
// seconds) and the sandbox runs; none otherwise. CPU use is the average
// since the sandbox last started, as a percentage of its CPUs (of one
// core when its template sets no CPU limit); memTotal is the template's
// memory limit (0: none). Page cache and disk use are not measured: 0.
func (g *Gateway) metrics(ctx context.Context, w http.ResponseWriter, r *http.Request, c caller) error {
	id, err := sandboxID(r)
	if err != nil {
		return err
	}
	window, err := parseWindow(r.URL.Query())
	if err != nil {
		return err
	}
	a, err := g.getSandbox(ctx, c, id)
	if err != nil {
		return err
	}
	now := g.now()
	samples := []sandboxMetric{}
	if !window.contains(now) || a.GetStatus().GetState() != torporv1.ActorState_ACTOR_STATE_RUNNING {
		writeJSON(w, http.StatusOK, samples)
		return nil
	}
	resp, err := g.actors.GetActorStats(ctx, withKey(&torporv1.GetRequest{Space: c.space, Name: id}, c.key))
	if err != nil {
		return err
	}
	stats := resp.Msg
	cpus, memoryMB := resourcesOf(a)
	samples = append(samples, sandboxMetric{
		Timestamp:     now.UTC().Format(time.RFC3339Nano),
		TimestampUnix: now.Unix(),
		CPUCount:      cpus,
		CPUUsedPct:    cpuPercent(stats, cpus, now),
		MemUsed:       stats.GetMemoryBytes(),
		MemTotal:      memoryMB << 20,
	})
	writeJSON(w, http.StatusOK, samples)
	return nil
}

// cpuPercent is the CPU the sandbox used since it started, averaged, as a
// percentage of cpus cores (one when 0).
func cpuPercent(stats *torporv1.ActorStats, cpus int32, now time.Time) float64 {
	if stats.GetStarted() == nil {
		return 0
	}
	elapsed := now.Sub(stats.GetStarted().AsTime()).Seconds()
	if elapsed <= 0 {
		return 0
	}
	cores := float64(max(cpus, 1))
	return stats.GetCpuSeconds() / elapsed / cores * 100
}

// window is the metrics' interval; a zero bound is open.
type window struct{ start, end time.Time }

func (w window) contains(t time.Time) bool {
	return (w.start.IsZero() || !t.Before(w.start)) && (w.end.IsZero() || !t.After(w.end))
}

func parseWindow(q url.Values) (window, error) {
	var w window
	for _, b := range []struct {
		name string
		to   *time.Time
	}{{"start", &w.start}, {"end", &w.end}} {
		v := q.Get(b.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return w, badRequest(b.name, "%q is not Unix seconds", v)
		}
		*b.to = time.Unix(n, 0)
	}
	return w, nil
}
