package e2b

import (
	"encoding/json"
	"fmt"
)

// The JSON bodies of E2B's REST API as the published SDK (npm e2b 2.50
// and 2.51) sends and reads them. Fields are spelled as the SDK spells
// them, allow_internet_access included.

// newSandbox is the body of POST /sandboxes and POST /v2/sandboxes.
type newSandbox struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int32            `json:"timeout"`
	AutoPause  *bool             `json:"autoPause"`
	AutoResume *autoResume       `json:"autoResume"`
	Secure     *bool             `json:"secure"`
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	// The sandbox's egress policy (sandboxEgress).
	AllowInternetAccess *bool        `json:"allow_internet_access"`
	Network             *networkBody `json:"network"`
	// What the gateway cannot honour: refused when set (refuseUnsupported).
	AutoPauseMemory *bool           `json:"autoPauseMemory"`
	MCP             json.RawMessage `json:"mcp"`
	IAM             json.RawMessage `json:"iam"`
	VolumeMounts    json.RawMessage `json:"volumeMounts"`
}

// networkBody is a create's network object.
type networkBody struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
	// What the gateway cannot honour: refused when set.
	AllowPublicTraffic json.RawMessage `json:"allowPublicTraffic"`
	MaskRequestHost    json.RawMessage `json:"maskRequestHost"`
	HTTPSPorts         json.RawMessage `json:"httpsPorts"`
	Rules              json.RawMessage `json:"rules"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
}

// networkInfo is the network of GET /sandboxes/{id}: the sandbox's own
// policy as E2B's lists.
type networkInfo struct {
	AllowOut []string `json:"allowOut,omitempty"`
	DenyOut  []string `json:"denyOut,omitempty"`
}

// autoResume is {"enabled": bool} (what the SDK sends); a bare boolean
// is taken too.
type autoResume struct {
	Enabled bool `json:"enabled"`
}

func (a *autoResume) UnmarshalJSON(data []byte) error {
	var b bool
	if err := json.Unmarshal(data, &b); err == nil {
		a.Enabled = b
		return nil
	}
	var obj struct {
		Enabled bool `json:"enabled"`
	}
	if err := json.Unmarshal(data, &obj); err != nil {
		return fmt.Errorf("autoResume: want {\"enabled\": true|false}: %w", err)
	}
	a.Enabled = obj.Enabled
	return nil
}

// connectBody is the body of POST /v2/sandboxes/{id}/connect (optional
// there), POST /sandboxes/{id}/connect and POST /sandboxes/{id}/resume.
type connectBody struct {
	Timeout *int32 `json:"timeout"`
	Memory  *bool  `json:"memory"`
	// autoPause of the deprecated resume call: refused when set (a
	// sandbox's lifecycle is fixed at create).
	AutoPause *bool `json:"autoPause"`
}

// timeoutBody is the body of POST /sandboxes/{id}/timeout.
type timeoutBody struct {
	Timeout *int32 `json:"timeout"`
}

// refreshBody is the body of POST /sandboxes/{id}/refreshes.
type refreshBody struct {
	Duration *int32 `json:"duration"`
}

// pauseBody is the body of POST /sandboxes/{id}/pause.
type pauseBody struct {
	Memory *bool `json:"memory"`
}

// sandbox answers create and connect.
type sandbox struct {
	TemplateID      string `json:"templateID"`
	SandboxID       string `json:"sandboxID"`
	ClientID        string `json:"clientID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	Domain          string `json:"domain,omitempty"`
}

// listedSandbox is an item of the lists.
type listedSandbox struct {
	TemplateID  string            `json:"templateID"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   string            `json:"startedAt"`
	EndAt       string            `json:"endAt"`
	CPUCount    int32             `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

// sandboxDetail answers GET /sandboxes/{id}.
type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken string    `json:"envdAccessToken,omitempty"`
	Domain          string    `json:"domain,omitempty"`
	Lifecycle       lifecycle `json:"lifecycle"`
	// The sandbox's own egress policy (networkOf).
	AllowInternetAccess *bool        `json:"allowInternetAccess,omitempty"`
	Network             *networkInfo `json:"network,omitempty"`
}

type lifecycle struct {
	AutoResume bool `json:"autoResume"`
	// "kill" or "pause".
	OnTimeout string `json:"onTimeout"`
}

// sandboxMetric is an item of GET /sandboxes/{id}/metrics.
type sandboxMetric struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int32   `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

// errorBody is every error's body: the SDK reads code (the HTTP status)
// and message.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}
