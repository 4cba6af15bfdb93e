package server

import (
	"embed"
	"io/fs"
	"net/http"
)

// dashboardFiles are the dashboard's page, script and style: static, no
// build step. They hold no data: the page reads it through the API with
// the token the user logs in with.
//
//go:embed dashboard
var dashboardFiles embed.FS

// dashboard serves the read-only web dashboard under /dashboard/.
func dashboard() http.Handler {
	files, err := fs.Sub(dashboardFiles, "dashboard")
	if err != nil {
		panic(err) // the embedded directory is there by construction
	}
	static := http.StripPrefix("/dashboard/", http.FileServerFS(files))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// Only the page's own files run; nothing is loaded from elsewhere,
		// and no other site may frame it.
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		static.ServeHTTP(w, r)
	})
}
