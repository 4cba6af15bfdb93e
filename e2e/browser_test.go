package e2e

import (
	"context"
	"errors"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// browser is a headless Chromium (Debian's, which .ci/run installs) with
// a window of width×height; what runs in it ends at the timeout.
func browser(t *testing.T, width, height int, timeout time.Duration) context.Context {
	t.Helper()
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium (Debian's package, which .ci/run installs): %v", err)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,                               // the tests run as root
		chromedp.Flag("ignore-certificate-errors", true), // the installation's own CA
		chromedp.WindowSize(width, height),
	)...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	ctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	t.Cleanup(cancelTimeout)
	return ctx
}

// signIn loads the dashboard at url and signs in with token. Chromium
// aborts a load when the host's network changes, which the tests running
// alongside do all the time (namespaces, veths, bridges): such a load is
// tried again.
func signIn(ctx context.Context, t *testing.T, url, token string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		err := chromedp.Do(ctx, chromedp.Navigate(url))
		var load *chromedp.LoadError
		if errors.As(err, &load) && load.ErrorText == "net::ERR_NETWORK_CHANGED" && attempt < 5 {
			t.Logf("loading %s: %v; again", url, err)
			continue
		}
		if err != nil {
			t.Fatalf("load the dashboard at %s: %v", url, err)
		}
		break
	}
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
	); err != nil {
		t.Fatalf("sign in to the dashboard at %s: %v", url, err)
	}
}
