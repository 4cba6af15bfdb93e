// Package retry is Torpor's one policy for riding out transient failures:
// exponential backoff with jitter (cenkalti/backoff), so node agents,
// routers and workflow drivers that lost the same server or database do
// not come back to it in a herd.
package retry

import (
	"context"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Policy is how long to wait between attempts and for how long to try.
type Policy struct {
	// Initial is the mean first wait; default 50 ms.
	Initial time.Duration
	// Max caps one wait; default 2 s.
	Max time.Duration
	// Budget bounds the time spent retrying, measured from the first
	// attempt; 0 retries until ctx ends.
	Budget time.Duration
}

// jitter spreads each wait over ±jitter of its mean.
const jitter = 0.5

// Backoff yields the waits of one series of attempts.
type Backoff struct {
	b     *backoff.ExponentialBackOff
	start time.Time
	p     Policy
}

// Start begins a series of attempts under p.
func (p Policy) Start() *Backoff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = p.Initial
	if b.InitialInterval <= 0 {
		b.InitialInterval = 50 * time.Millisecond
	}
	b.MaxInterval = p.Max
	if b.MaxInterval <= 0 {
		b.MaxInterval = 2 * time.Second
	}
	b.RandomizationFactor = jitter
	b.Multiplier = 2
	return &Backoff{b: b, start: time.Now(), p: p}
}

// Next returns the wait before the next attempt.
func (b *Backoff) Next() time.Duration { return b.b.NextBackOff() }

// Reset starts the series over: the next wait is short again.
func (b *Backoff) Reset() {
	b.b.Reset()
	b.start = time.Now()
}

// Wait sleeps before the next attempt. It returns false, at once, when the
// budget would be spent by then or ctx ends first.
func (b *Backoff) Wait(ctx context.Context) bool {
	d := b.Next()
	if b.p.Budget > 0 && time.Since(b.start)+d > b.p.Budget {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Do calls fn until it returns nil or an error transient does not accept,
// the budget is spent, or ctx ends, and returns fn's last error.
func Do(ctx context.Context, p Policy, transient func(error) bool, fn func(context.Context) error) error {
	b := p.Start()
	for {
		err := fn(ctx)
		if err == nil || !transient(err) || !b.Wait(ctx) {
			return err
		}
	}
}
