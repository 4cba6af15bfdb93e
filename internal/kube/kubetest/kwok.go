package kubetest

import (
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// kwokModule is the module kwok is built from; its source holds the stage
// configurations (the lifecycle of fake Nodes and Pods) that kwok reads
// and does not build in.
const kwokModule = "sigs.k8s.io/kwok"

// kwokStages are the stages kwokctl runs kwok with by default, relative
// to the kwok module's root: Nodes become Ready and keep heartbeating;
// Pods bound to them become Running and Ready, complete, and are removed
// once deleted.
var kwokStages = []string{
	"kustomize/stage/node/fast/node-initialize.yaml",
	"kustomize/stage/node/heartbeat/node-heartbeat.yaml",
	"kustomize/stage/pod/fast/pod-ready.yaml",
	"kustomize/stage/pod/fast/pod-complete.yaml",
	"kustomize/stage/pod/fast/pod-delete.yaml",
}

// kwokStageFiles are the stage configurations of the kwok version the
// binary at kwok was built from, taken from that module's source in the
// Go module cache (where `make kube` put it; go mod download fetches it
// otherwise). workDir is where go runs, outside any module so it changes
// no go.mod.
func kwokStageFiles(kwok, workDir string) ([]string, error) {
	info, err := buildinfo.ReadFile(kwok)
	if err != nil {
		return nil, fmt.Errorf("read the build information of %s (build it with `make kube`): %w", kwok, err)
	}
	if info.Main.Path != kwokModule || !strings.HasPrefix(info.Main.Version, "v") {
		return nil, fmt.Errorf("%s is not a release of %s (its main module is %s %s): build it with `make kube`", kwok, kwokModule, info.Main.Path, info.Main.Version)
	}
	cmd := exec.Command("go", "mod", "download", "-json", kwokModule+"@"+info.Main.Version)
	cmd.Dir = workDir
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("find the source of %s@%s for its stage configurations: go mod download: %w: %s", kwokModule, info.Main.Version, err, out)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		return nil, fmt.Errorf("go mod download -json %s@%s: no module directory in %q (%v)", kwokModule, info.Main.Version, out, err)
	}
	files := make([]string, len(kwokStages))
	for i, stage := range kwokStages {
		files[i] = filepath.Join(mod.Dir, stage)
		if _, err := os.Stat(files[i]); err != nil {
			return nil, fmt.Errorf("kwok stage configuration: %w", err)
		}
	}
	return files, nil
}
