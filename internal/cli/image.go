package cli

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor/internal/image"
)

func newImageCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "image",
		Short:   "Make images for templates without a container engine",
		Example: "  torpor image build ./rootfs --entrypoint '/usr/bin/python3 /app/main.py' -o ~/.local/share/torpor/images/app",
	}
	cmd.AddCommand(newImageBuildCommand())
	return cmd
}

func newImageBuildCommand() *cobra.Command {
	var (
		out, tag, workdir, user, entrypoint, command string
		env                                          []string
	)
	cmd := &cobra.Command{
		Use:   "build ROOTFS -o LAYOUT",
		Short: "Make an image from a root filesystem directory or tar, with its entrypoint, environment and working directory",
		Long: `Make an OCI image layout at LAYOUT (replacing one there) holding one image:
ROOTFS as its only layer, a directory (files keep their modes, owners and
symlinks) or a tar of one, gzipped or not, and the config the flags give.
No container engine is needed. It prints the image's pinned reference, for a
template's image: field; the node reads it from an allowed directory (<data
dir>/images, or one of --allow-image-dir).

--entrypoint and --cmd take words separated by spaces, or a JSON array for
arguments with spaces: --cmd '["sh", "-c", "echo hello world"]'.`,
		Example: `  # a Python app on a root filesystem unpacked from a distribution's tarball
  torpor image build ./rootfs --entrypoint '/usr/bin/python3 /app/main.py' \
    --env PORT=8080 --workdir /app -o ~/.local/share/torpor/images/app
  # straight from a tar
  torpor image build rootfs.tar.gz --entrypoint /bin/server --tag v2 -o ./image`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("-o: name the image layout directory to write")
			}
			cfg := v1.Config{Env: env, WorkingDir: workdir, User: user}
			var err error
			if cfg.Entrypoint, err = argv("--entrypoint", entrypoint); err != nil {
				return err
			}
			if cfg.Cmd, err = argv("--cmd", command); err != nil {
				return err
			}
			if len(cfg.Entrypoint) == 0 && len(cfg.Cmd) == 0 {
				return fmt.Errorf("--entrypoint or --cmd: say what the image runs")
			}
			for _, e := range env {
				if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
					return fmt.Errorf("--env %q: want NAME=VALUE", e)
				}
			}
			if workdir != "" && !strings.HasPrefix(workdir, "/") {
				return fmt.Errorf("--workdir %q: want an absolute path in the image", workdir)
			}
			digest, err := image.BuildFromRootfs(cmd.Context(), out, image.RootfsSpec{Source: args[0], Config: cfg, Tag: tag})
			if err != nil {
				return err
			}
			abs, err := filepath.Abs(out)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), image.LayoutScheme+abs+"@"+digest.String())
			return nil
		},
	}
	flags := cmd.Flags()
	flags.StringVarP(&out, "output", "o", "", "image layout directory to write (replaced if it exists)")
	flags.StringVar(&entrypoint, "entrypoint", "", "what the image runs (its ENTRYPOINT): words, or a JSON array")
	flags.StringVar(&command, "cmd", "", "arguments after the entrypoint, or the command without one (its CMD): words, or a JSON array")
	flags.StringArrayVar(&env, "env", nil, "NAME=VALUE in the image's environment (repeat for more)")
	flags.StringVar(&workdir, "workdir", "", "working directory of the image's process (absolute)")
	flags.StringVar(&user, "user", "", "user (and group) the process runs as: NAME, UID or UID:GID")
	flags.StringVar(&tag, "tag", "latest", "tag of the image in the layout (oci:LAYOUT:TAG)")
	return cmd
}

// argv reads a command line flag's value: a JSON array, or words separated
// by spaces.
func argv(flag, value string) ([]string, error) {
	value = strings.TrimSpace(value)
	if !strings.HasPrefix(value, "[") {
		return strings.Fields(value), nil
	}
	var words []string
	if err := json.Unmarshal([]byte(value), &words); err != nil {
		return nil, fmt.Errorf("%s %s: want a JSON array of strings or words separated by spaces: %w", flag, value, err)
	}
	return words, nil
}
