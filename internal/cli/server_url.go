package cli

import "strings"

// ServerURL resolves the API base URL the way the client commands do (the
// flag value, then TORPOR_SERVER, then the client config file, then the
// local default), so process roles that call the API (the router) find the
// same server as the CLI. A bare host:port, as --listen takes it, gets
// http://.
func ServerURL(flag string) (string, error) {
	base, err := serverURL(flag)
	if err != nil {
		return "", err
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return strings.TrimSuffix(base, "/"), nil
}
