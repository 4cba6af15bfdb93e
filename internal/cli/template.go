package cli

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	torporv1 "github.com/torpor-dev/torpor/api/gen/torpor/v1"
)

var templateKind = &kind[*torporv1.Template]{
	name:   "template",
	plural: "templates",
	spaced: true,
	columns: []column[*torporv1.Template]{
		{"PHASE", func(t *torporv1.Template) string { return enumName(t.GetStatus().GetPhase()) }},
		{"CLASS", func(t *torporv1.Template) string { return t.GetSpec().GetSandboxClass() }},
		{"CONTAINERS", func(t *torporv1.Template) string {
			names := make([]string, len(t.GetSpec().GetContainers()))
			for i, c := range t.GetSpec().GetContainers() {
				names[i] = c.GetName()
			}
			return strings.Join(names, ",")
		}},
	},
	get: func(ctx context.Context, c *clients, req *torporv1.GetRequest) (*torporv1.Template, error) {
		return call(ctx, c.templates.GetTemplate, req)
	},
	list: func(ctx context.Context, c *clients, req *torporv1.ListRequest) ([]*torporv1.Template, string, error) {
		resp, err := call(ctx, c.templates.ListTemplates, req)
		return resp.GetTemplates(), resp.GetNextPageToken(), err
	},
	delete: func(ctx context.Context, c *clients, req *torporv1.DeleteRequest) error {
		_, err := call(ctx, c.templates.DeleteTemplate, req)
		return err
	},
}

func newTemplateCommand(a *app) *cobra.Command {
	noun := templateKind.nounCommand(a, "Manage templates, the immutable definitions actors are made from")
	noun.AddCommand(newTemplateApplyCommand(a))
	return noun
}

func newTemplateApplyCommand(a *app) *cobra.Command {
	var files []string
	var wait time.Duration
	cmd := &cobra.Command{
		Use:     "apply -f FILE",
		Aliases: []string{"create"},
		Short:   "Create the templates of YAML files",
		Long: "Create the templates of YAML files. Image tags are pinned by digest and every\n" +
			"template is checked before any is sent. Templates are immutable: applying an\n" +
			"identical one again leaves it unchanged, a changed one needs a new name.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var manifests []*manifest
			for _, file := range files {
				ms, err := a.readTemplateFile(cmd, file)
				if err != nil {
					return err
				}
				manifests = append(manifests, ms...)
			}
			if err := checkDistinct(manifests); err != nil {
				return err
			}
			c, err := a.clients()
			if err != nil {
				return err
			}
			for _, m := range manifests {
				t, verb, err := applyTemplate(cmd.Context(), c, m.template)
				if err != nil {
					return err
				}
				if err := templateKind.printChanged(cmd.OutOrStdout(), a.output, t, verb); err != nil {
					return err
				}
				if wait > 0 {
					if err := waitForGolden(cmd.Context(), cmd.ErrOrStderr(), c, t, wait); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVarP(&files, "filename", "f", nil, "template YAML file, - for stdin (repeatable)")
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for each template's golden snapshot, printing its progress (e.g. --wait 2m)")
	cmd.Flags().Lookup("wait").NoOptDefVal = "5m"
	_ = cmd.MarkFlagRequired("filename") // the flag exists: cannot fail
	return cmd
}

// readTemplateFile loads the templates of one file ("-" reads stdin).
func (a *app) readTemplateFile(cmd *cobra.Command, file string) ([]*manifest, error) {
	var (
		data    []byte
		baseDir string
		err     error
	)
	if file == "-" {
		data, err = readManifest(cmd.InOrStdin())
		file, baseDir = "<stdin>", "."
	} else {
		data, err = readManifestFile(file)
		baseDir = filepath.Dir(file)
	}
	if err != nil {
		return nil, fmt.Errorf("read templates: %w", err)
	}
	if baseDir, err = filepath.Abs(baseDir); err != nil {
		return nil, fmt.Errorf("read templates from %s: %w", file, err)
	}
	return loadTemplates(cmd.Context(), file, data, baseDir, a.space, cmd.Flags().Changed("space"))
}

// loadTemplates parses, pins and validates the templates of a file whose
// relative image paths start at baseDir. A document without a space gets
// space; one with a space must agree with it when the user chose it.
func loadTemplates(ctx context.Context, file string, data []byte, baseDir, space string, spaceChosen bool) ([]*manifest, error) {
	manifests, err := parseTemplates(file, data)
	if err != nil {
		return nil, err
	}
	for _, m := range manifests {
		meta := m.template.GetMetadata()
		if meta == nil {
			meta = &torporv1.ObjectMeta{}
			m.template.Metadata = meta
		}
		switch {
		case meta.GetSpace() == "":
			meta.Space = space
		case spaceChosen && meta.GetSpace() != space:
			return nil, m.errorAt("metadata.space", fmt.Errorf("metadata.space: %q differs from --space %q", meta.GetSpace(), space))
		}
		if err := m.pinImages(ctx, baseDir); err != nil {
			return nil, err
		}
		if err := m.validate(); err != nil {
			return nil, err
		}
	}
	return manifests, nil
}

// checkDistinct refuses two documents naming one template: the second
// would fail on the server after the first was written.
func checkDistinct(manifests []*manifest) error {
	first := map[string]*manifest{}
	for _, m := range manifests {
		key := m.template.GetMetadata().GetSpace() + "/" + m.template.GetMetadata().GetName()
		if prev, ok := first[key]; ok {
			return m.errorAt("metadata.name", fmt.Errorf("template %s is also defined at %s:%d", key, prev.file, prev.lineOf("metadata.name")))
		}
		first[key] = m
	}
	return nil
}

// applyTemplate creates t and says whether it was new. The server returns
// an identical existing template unchanged and refuses a different one.
func applyTemplate(ctx context.Context, c *clients, t *torporv1.Template) (*torporv1.Template, string, error) {
	_, err := call(ctx, c.templates.GetTemplate, &torporv1.GetRequest{Space: t.GetMetadata().GetSpace(), Name: t.GetMetadata().GetName()})
	existed := err == nil
	if err != nil && connect.CodeOf(err) != connect.CodeNotFound {
		return nil, "", err
	}
	stored, err := call(ctx, c.templates.CreateTemplate, &torporv1.CreateTemplateRequest{Template: t})
	if err != nil {
		return nil, "", err
	}
	if existed {
		return stored, "unchanged", nil
	}
	return stored, "created", nil
}

// waitForGolden polls the template until its golden snapshot is READY or
// the build FAILED, printing a line whenever its phase or message changes.
func waitForGolden(ctx context.Context, out io.Writer, c *clients, t *torporv1.Template, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	start := time.Now()
	key := &torporv1.GetRequest{Space: t.GetMetadata().GetSpace(), Name: t.GetMetadata().GetName()}
	last := ""
	for {
		st := t.GetStatus()
		line := enumName(st.GetPhase())
		if st.GetMessage() != "" {
			line += ": " + st.GetMessage()
		}
		if line != last {
			fmt.Fprintf(out, "template/%s golden snapshot: %s (%s)\n", key.GetName(), line, time.Since(start).Round(100*time.Millisecond))
			last = line
		}
		switch st.GetPhase() {
		case torporv1.TemplatePhase_TEMPLATE_PHASE_READY:
			return nil
		case torporv1.TemplatePhase_TEMPLATE_PHASE_FAILED:
			return fmt.Errorf("template %s: golden snapshot failed: %s", key.GetName(), st.GetMessage())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("template %s: golden snapshot not ready after %s (phase %s)", key.GetName(), limit, enumName(st.GetPhase()))
		case <-time.After(200 * time.Millisecond):
		}
		var err error
		if t, err = call(ctx, c.templates.GetTemplate, key); err != nil {
			return err
		}
	}
}
