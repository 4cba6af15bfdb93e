// Package envd is the in-sandbox API of an E2B sandbox: a daemon speaking
// the envd protocol the published E2B SDK (npm and PyPI `e2b`) uses on
// port 49983 of every sandbox. It serves Connect RPC (JSON or binary) for
// the process and filesystem services (api/envd), and plain HTTP for file
// upload and download (/files) and a health check (/health).
//
// The node agent runs it inside every E2B sandbox (`torpor envd`, see
// Main), from the same static binary it uses for the file helper, so any
// template's image gets it. Everything it starts lives inside the sandbox:
// a suspend checkpoints the daemon, its process table and its processes
// together, and after a restore the SDK finds them again by pid.
//
// Users. The SDK names a user per call (HTTP Basic authorization with an
// empty password; `username` on /files) or none, meaning the default
// user. A named user that exists in the sandbox's /etc/passwd, and that
// the daemon can become (it runs as root, or as that user), is who the
// call runs as; any other name, and no name when the image has no user
// "user", falls back to the container's own user (the one the template's
// process runs as, the daemon's). Relative paths and a process's default
// working directory are that user's home directory when it exists, else
// "/". So on an image without E2B's "user" and /home/user, commands run as
// the container's user (usually root) in its home (/root), or in /.
//
// Environment of a process: the container's environment (image ENV and
// the template's env, which the daemon inherits), then HOME, USER and
// LOGNAME of the user it runs as, then the sandbox's env (Config.Env, the
// envVars given at create), then the call's envs; later ones win.
package envd

import (
	"log/slog"
	"net/http"

	"github.com/torpor-dev/torpor/api/gen/envd/filesystem/filesystemconnect"
	"github.com/torpor-dev/torpor/api/gen/envd/process/processconnect"
)

// Version is the envd protocol version this daemon implements, which the
// control plane reports as a sandbox's envdVersion: the SDK turns its
// features on by it (0.4.0: no default user sent; 0.5.2: CloseStdin;
// 0.5.7: octet-stream uploads). Features of later versions (file
// metadata, 0.6.2; watch entries, 0.6.3) are not served.
const Version = "0.5.7"

// Port is where the daemon listens in the sandbox.
const Port = 49983

// DefaultUser is the user a call without one runs as, when it exists.
const DefaultUser = "user"

// Config is what the node gives the daemon when it starts it.
type Config struct {
	// AccessToken, when set, must come with every call but /health
	// (X-Access-Token), or a /files URL must carry a signature made with
	// it.
	AccessToken string `json:"accessToken,omitempty"`
	// Env reaches every process the daemon starts (the sandbox's envVars).
	Env map[string]string `json:"env,omitempty"`
}

// Server is the daemon's API. Close stops its watchers; processes it
// started keep running (they belong to the sandbox).
type Server struct {
	cfg      Config
	log      *slog.Logger
	users    *users
	procs    *processTable
	watchers *watchers
}

// New makes a server with cfg; log may be nil.
func New(cfg Config, log *slog.Logger) *Server {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log, users: newUsers(), procs: newProcessTable(log), watchers: newWatchers()}
}

// Handler serves the whole API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{s: s}))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	return s.authorize(mux)
}

// Close stops the watchers; Start and Connect streams end with their
// connections.
func (s *Server) Close() {
	s.watchers.closeAll()
}
