// Package deploy_test checks the deployment files a user applies as they are
// (deploy/kubernetes/), the values file for the official chart
// (deploy/helm/values.yaml) and the image they run (Containerfile) against
// what the binary reads and serves: ports, probe paths, variable names.
package deploy_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/opal-go/opal-client/config"
	"github.com/opal-go/opal-client/internal/agent"
	"github.com/opal-go/opal-client/internal/devserver"
	"github.com/opal-go/opal-client/internal/status"
)

// What the sidecar must be probed on (docs/kubernetes.md): liveness on the
// route that stays 200 through outages, readiness on the one that says a
// policy is loaded. The official chart probes chartProbePath on the "http"
// port for both (templates/deployment-client.yaml).
const (
	livenessPath   = "/healthcheck"
	readinessPath  = "/ready"
	chartProbePath = "/healthcheck"
	image          = "localhost/opal-client:dev" // the Makefile's IMAGE
)

// chartEnv is what the chart's client template sets besides extraEnv.
var chartEnv = map[string]string{
	"UVICORN_NUM_WORKERS":       "1",
	"OPAL_SERVER_URL":           "http://myopal-server:7002",
	"OPAL_DATA_UPDATER_ENABLED": "False",
}

// nonOPAL are the names outside the OPAL_ prefix the image, the manifests or
// the chart may set: the Python image's server settings. UVICORN_PORT is the
// image's API port; UVICORN_NUM_WORKERS has no meaning for this agent.
var nonOPAL = []string{"UVICORN_PORT", "UVICORN_NUM_WORKERS"}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port string `yaml:"port"`
	} `yaml:"httpGet"`
}

type envVar struct {
	Name      string `yaml:"name"`
	Value     string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *struct {
			Name string `yaml:"name"`
			Key  string `yaml:"key"`
		} `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

type container struct {
	Name  string `yaml:"name"`
	Image string `yaml:"image"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	Env            []envVar `yaml:"env"`
	LivenessProbe  *probe   `yaml:"livenessProbe"`
	ReadinessProbe *probe   `yaml:"readinessProbe"`
	StartupProbe   *probe   `yaml:"startupProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		ReadOnlyRootFilesystem   bool  `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
	} `yaml:"volumeMounts"`
}

type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name string `yaml:"name"`
	} `yaml:"metadata"`
	Spec struct {
		Template struct {
			Spec struct {
				SecurityContext struct {
					RunAsUser    *int `yaml:"runAsUser"`
					RunAsNonRoot bool `yaml:"runAsNonRoot"`
				} `yaml:"securityContext"`
				Containers []container `yaml:"containers"`
				Volumes    []struct {
					Name string `yaml:"name"`
				} `yaml:"volumes"`
			} `yaml:"spec"`
		} `yaml:"template"`
		Ports []struct {
			Name       string `yaml:"name"`
			Port       int    `yaml:"port"`
			TargetPort string `yaml:"targetPort"`
		} `yaml:"ports"`
	} `yaml:"spec"`
	StringData map[string]string `yaml:"stringData"`
	Resources  []string          `yaml:"resources"` // Kustomization
}

// manifests parses every YAML document under deploy/kubernetes, keyed by
// file name.
func manifests(t *testing.T) map[string][]object {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	out := map[string][]object{}
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(r)
		for {
			var o object
			err := dec.Decode(&o)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.APIVersion == "" || o.Kind == "" {
				t.Fatalf("%s: a document without apiVersion/kind", f)
			}
			out[filepath.Base(f)] = append(out[filepath.Base(f)], o)
		}
		r.Close()
	}
	return out
}

func find(t *testing.T, m map[string][]object, kind string) object {
	t.Helper()
	for _, objs := range m {
		for _, o := range objs {
			if o.Kind == kind {
				return o
			}
		}
	}
	t.Fatalf("no %s in deploy/kubernetes", kind)
	return object{}
}

func sidecar(t *testing.T, d object) container {
	t.Helper()
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Name == "opal-client" {
			return c
		}
	}
	t.Fatal(`the Deployment has no "opal-client" container`)
	return container{}
}

func (c container) port(t *testing.T, name string) int {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, name)
	return 0
}

// imageConfig reads the Containerfile's ENV (K=V pairs, single-quoted
// values, continuation lines) and USER.
func imageConfig(t *testing.T) (env map[string]string, user string) {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "Containerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	env = map[string]string{}
	var stmt string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if stmt == "" && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			stmt += strings.TrimSuffix(line, `\`) + " "
			continue
		}
		stmt += line
		switch {
		case strings.HasPrefix(stmt, "ENV "):
			parseEnv(t, strings.TrimPrefix(stmt, "ENV "), env)
		case strings.HasPrefix(stmt, "USER "):
			user = strings.TrimSpace(strings.TrimPrefix(stmt, "USER "))
		}
		stmt = ""
	}
	if len(env) == 0 || user == "" {
		t.Fatalf("Containerfile: env %v, user %q", env, user)
	}
	return env, user
}

func parseEnv(t *testing.T, s string, env map[string]string) {
	t.Helper()
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		k, rest, ok := strings.Cut(s, "=")
		if !ok || strings.ContainsAny(k, " \t") {
			t.Fatalf("Containerfile: ENV %q is not K=V", s)
		}
		var v string
		if strings.HasPrefix(rest, "'") {
			end := strings.Index(rest[1:], "'")
			if end < 0 {
				t.Fatalf("Containerfile: unterminated quote in ENV %s", k)
			}
			v, s = rest[1:1+end], rest[2+end:]
		} else {
			v, s, _ = strings.Cut(rest, " ")
		}
		env[k] = v
	}
}

// known reports whether the binary reads the variable (or it is one of the
// Python image's server settings).
func known(name string) bool {
	return slices.Contains(config.Variables(), name) || slices.Contains(nonOPAL, name)
}

// effective is the container's environment: the image's, overridden by the
// manifest's (a secret reference gets a placeholder value).
func effective(imageEnv map[string]string, c container) map[string]string {
	env := map[string]string{}
	for k, v := range imageEnv {
		env[k] = v
	}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			env[e.Name] = "from-a-secret"
			continue
		}
		env[e.Name] = e.Value
	}
	return env
}

func load(t *testing.T, env map[string]string) *config.Config {
	t.Helper()
	cfg, err := config.LoadFrom(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("the binary refuses this environment: %v", err)
	}
	return cfg
}

func splitPort(t *testing.T, addr string) (string, int) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

func TestImage_ListensLikeThePythonImage(t *testing.T) {
	env, user := imageConfig(t)
	for k := range env {
		if !known(k) {
			t.Errorf("the image sets %s, which the binary does not read", k)
		}
	}
	cfg := load(t, env)
	if cfg.ClientAPIServerHost != "0.0.0.0" || cfg.ClientAPIServerPort != 7000 {
		t.Errorf("client API on %s:%d, want 0.0.0.0:7000", cfg.ClientAPIServerHost, cfg.ClientAPIServerPort)
	}
	if cfg.InlineOPAConfig.Addr != "0.0.0.0:8181" || !cfg.InlineOPAEnabled {
		t.Errorf("inline OPA %v on %s, want on 0.0.0.0:8181", cfg.InlineOPAEnabled, cfg.InlineOPAConfig.Addr)
	}
	if env["UVICORN_PORT"] != "7000" {
		t.Errorf("UVICORN_PORT=%q, the Python image sets 7000", env["UVICORN_PORT"])
	}
	if uid, _, _ := strings.Cut(user, ":"); uid == "0" || uid == "root" {
		t.Errorf("image user %q is root", user)
	}
	if path.Dir(cfg.StoreBackupPath) != "/opal/backup" {
		t.Errorf("backup path %s is not in the image's /opal/backup volume", cfg.StoreBackupPath)
	}
}

func TestManifests_Sidecar(t *testing.T) {
	m := manifests(t)
	imageEnv, user := imageConfig(t)
	d := find(t, m, "Deployment")
	c := sidecar(t, d)
	cfg := load(t, effective(imageEnv, c))

	t.Run("kustomization_lists_every_file", func(t *testing.T) {
		k := find(t, m, "Kustomization")
		for f := range m {
			if f != "kustomization.yaml" && !slices.Contains(k.Resources, f) {
				t.Errorf("kustomization.yaml does not list %s", f)
			}
		}
	})
	t.Run("image_is_the_built_one", func(t *testing.T) {
		if c.Image != image {
			t.Errorf("image %q, want %q", c.Image, image)
		}
	})
	t.Run("ports_are_the_ones_served", func(t *testing.T) {
		if got := c.port(t, "http"); got != cfg.ClientAPIServerPort {
			t.Errorf("http containerPort %d, the client API serves %d", got, cfg.ClientAPIServerPort)
		}
		host, opa := splitPort(t, cfg.InlineOPAConfig.Addr)
		if got := c.port(t, "opa"); got != opa {
			t.Errorf("opa containerPort %d, OPA serves %d", got, opa)
		}
		// The kubelet probes the pod IP, not loopback.
		if cfg.ClientAPIServerHost != "0.0.0.0" || host != "0.0.0.0" {
			t.Errorf("listening on %s and %s; probes and the Service need 0.0.0.0", cfg.ClientAPIServerHost, host)
		}
	})
	t.Run("probes", func(t *testing.T) {
		for _, p := range []struct {
			name string
			pr   *probe
			want string
		}{{"liveness", c.LivenessProbe, livenessPath}, {"readiness", c.ReadinessProbe, readinessPath}, {"startup", c.StartupProbe, readinessPath}} {
			if p.pr == nil || p.pr.HTTPGet == nil {
				t.Errorf("no %s probe", p.name)
				continue
			}
			if p.pr.HTTPGet.Path != p.want || p.pr.HTTPGet.Port != "http" {
				t.Errorf("%s probe on %s port %s, want %s port http", p.name, p.pr.HTTPGet.Path, p.pr.HTTPGet.Port, p.want)
			}
		}
	})
	t.Run("env_names_are_read", func(t *testing.T) {
		for _, e := range c.Env {
			if !known(e.Name) {
				t.Errorf("env %s is not a variable the binary reads", e.Name)
			}
		}
	})
	t.Run("token_from_the_secret", func(t *testing.T) {
		s := find(t, m, "Secret")
		for _, e := range c.Env {
			if e.Name == "OPAL_CLIENT_TOKEN" {
				if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name != s.Metadata.Name ||
					s.StringData[e.ValueFrom.SecretKeyRef.Key] == "" {
					t.Errorf("OPAL_CLIENT_TOKEN is not read from the Secret %s", s.Metadata.Name)
				}
				return
			}
		}
		t.Error("no OPAL_CLIENT_TOKEN")
	})
	t.Run("read_only_root_with_a_backup_volume", func(t *testing.T) {
		if !c.SecurityContext.ReadOnlyRootFilesystem {
			t.Error("readOnlyRootFilesystem is not set")
		}
		if !cfg.OfflineModeEnabled {
			t.Fatal("offline mode is off: a restarted pod would have no policy while the server is down")
		}
		dir := path.Dir(cfg.StoreBackupPath)
		var vol string
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == dir {
				vol = vm.Name
			}
		}
		if vol == "" {
			t.Fatalf("the backup directory %s is not a volume: a read-only root cannot hold it", dir)
		}
		if !slices.ContainsFunc(d.Spec.Template.Spec.Volumes, func(v struct {
			Name string `yaml:"name"`
		}) bool {
			return v.Name == vol
		}) {
			t.Errorf("volume %s is mounted but not declared", vol)
		}
	})
	t.Run("non_root_as_the_image_user", func(t *testing.T) {
		ps := d.Spec.Template.Spec.SecurityContext
		uid, _, _ := strings.Cut(user, ":")
		if !ps.RunAsNonRoot || ps.RunAsUser == nil || strconv.Itoa(*ps.RunAsUser) != uid {
			t.Errorf("pod securityContext runAsNonRoot %v runAsUser %v, want the image's %s", ps.RunAsNonRoot, ps.RunAsUser, uid)
		}
	})
	t.Run("resources", func(t *testing.T) {
		if c.Resources.Requests["memory"] == "" || c.Resources.Requests["cpu"] == "" || c.Resources.Limits["memory"] == "" {
			t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
		}
	})
	t.Run("service_targets_named_ports", func(t *testing.T) {
		s := find(t, m, "Service")
		for _, want := range []string{"http", "opa"} {
			i := slices.IndexFunc(s.Spec.Ports, func(p struct {
				Name       string `yaml:"name"`
				Port       int    `yaml:"port"`
				TargetPort string `yaml:"targetPort"`
			}) bool {
				return p.TargetPort == want
			})
			if i < 0 || s.Spec.Ports[i].Port != c.port(t, want) {
				t.Errorf("Service does not expose %s on its container port", want)
			}
		}
	})
	t.Run("served", func(t *testing.T) {
		// The probes the manifest names, and the chart's, answer 200 on
		// the agent this environment starts (ports moved to free ones,
		// the listening host kept), and OPA decides.
		serve(t, cfg, []string{c.LivenessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Path, chartProbePath})
	})
}

// chartAllows is what the chart's values.schema.json accepts
// ("additionalProperties": false) under the keys this file sets: helm
// refuses any other key at install.
var chartAllows = map[string][]string{
	"":             {"openshift", "image", "server", "client", "postgresql"},
	"image":        {"server", "client", "pgsql"},
	"image.client": {"registry", "repository", "tag", "pullSecrets"},
	"client": {"securityContext", "containerSecurityContext", "enabled", "port", "opaPort", "replicas", "extraEnv",
		"opaStartupData", "serverUrl", "secrets", "resources", "imagePullPolicy", "podLabels", "nodeSelector", "tolerations", "affinity"},
}

// checkKeys reports the keys of m (at prefix) the chart's schema refuses.
func checkKeys(t *testing.T, prefix string, m map[string]any) {
	t.Helper()
	allowed, ok := chartAllows[prefix]
	if !ok {
		return // free-form below here (extraEnv, resources, ...)
	}
	for k, v := range m {
		if !slices.Contains(allowed, k) {
			t.Errorf("values key %q: the chart's schema refuses it", strings.TrimPrefix(prefix+"."+k, "."))
		}
		if sub, ok := v.(map[string]any); ok {
			checkKeys(t, strings.TrimPrefix(prefix+"."+k, "."), sub)
		}
	}
}

// helmValues is the part of the chart's values this file sets.
type helmValues struct {
	Image struct {
		Client struct {
			Registry   string `yaml:"registry"`
			Repository string `yaml:"repository"`
			Tag        string `yaml:"tag"`
		} `yaml:"client"`
	} `yaml:"image"`
	Client struct {
		Port                     int               `yaml:"port"`
		OPAPort                  int               `yaml:"opaPort"`
		ExtraEnv                 map[string]string `yaml:"extraEnv"`
		ContainerSecurityContext struct {
			ReadOnlyRootFilesystem bool `yaml:"readOnlyRootFilesystem"`
		} `yaml:"containerSecurityContext"`
		SecurityContext struct {
			RunAsUser int `yaml:"runAsUser"`
		} `yaml:"securityContext"`
	} `yaml:"client"`
}

func TestHelmValues_SwapInTheImage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("helm", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v helmValues
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	var raw map[string]any
	if err := yaml.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	checkKeys(t, "", raw)
	// The chart's opal.clientImage: registry/repository:tag.
	if got := v.Image.Client.Registry + "/" + v.Image.Client.Repository + ":" + v.Image.Client.Tag; got != image {
		t.Errorf("chart renders image %q, want %q", got, image)
	}
	imageEnv, user := imageConfig(t)
	env := map[string]string{}
	for k, val := range imageEnv {
		env[k] = val
	}
	for k, val := range chartEnv {
		if !known(k) {
			t.Errorf("the chart sets %s, which the binary does not read", k)
		}
		env[k] = val
	}
	for k, val := range v.Client.ExtraEnv {
		if !known(k) {
			t.Errorf("extraEnv %s is not a variable the binary reads", k)
		}
		env[k] = val
	}
	cfg := load(t, env)
	if v.Client.Port != cfg.ClientAPIServerPort {
		t.Errorf("client.port %d (the chart's http port, probed on %s), the image serves the client API on %d", v.Client.Port, chartProbePath, cfg.ClientAPIServerPort)
	}
	if _, opa := splitPort(t, cfg.InlineOPAConfig.Addr); v.Client.OPAPort != opa {
		t.Errorf("client.opaPort %d, the image serves OPA on %d", v.Client.OPAPort, opa)
	}
	if uid, _, _ := strings.Cut(user, ":"); strconv.Itoa(v.Client.SecurityContext.RunAsUser) != uid {
		t.Errorf("runAsUser %d, the image's user is %s", v.Client.SecurityContext.RunAsUser, uid)
	}
	// A read-only root is only safe while nothing is written: offline mode
	// needs a volume the chart does not offer.
	if v.Client.ContainerSecurityContext.ReadOnlyRootFilesystem && cfg.OfflineModeEnabled {
		t.Error("offline mode with a read-only root and no backup volume")
	}
}

// serve starts the agent on cfg against the dev server on examples/policy
// and checks that each probe path answers 200 once the policy is loaded, that
// an unknown path does not (the check can fail), and that OPA decides.
func serve(t *testing.T, cfg *config.Config, paths []string) {
	t.Helper()
	srv := devserver.New(devserver.Options{PolicyDir: filepath.Join("..", "examples", "policy"),
		Logger: slog.New(slog.DiscardHandler)})
	hs := httptest.NewServer(srv)
	defer hs.Close()
	defer srv.Close()

	c := *cfg
	env := map[string]string{"OPAL_SERVER_URL": hs.URL, "OPAL_CLIENT_TOKEN": "", "OPAL_STORE_BACKUP_PATH": filepath.Join(t.TempDir(), "opa.json")}
	for k, v := range map[string]string{"OPAL_OFFLINE_MODE_ENABLED": strconv.FormatBool(cfg.OfflineModeEnabled),
		"OPAL_POLICY_SUBSCRIPTION_DIRS": strings.Join(cfg.PolicySubscriptionDirs, ":")} {
		env[k] = v
	}
	re := load(t, env) // the derived server URLs, for the dev server
	c.ServerURL, c.ServerWSURL, c.ServerPubSubURL, c.DefaultDataSourcesConfigURL = re.ServerURL, re.ServerWSURL, re.ServerPubSubURL, re.DefaultDataSourcesConfigURL
	c.DefaultUpdateCallbacks, c.ClientToken, c.StoreBackupPath = re.DefaultUpdateCallbacks, "", re.StoreBackupPath
	// Free ports (7000 and 8181 may be taken on this machine), same host.
	c.ClientAPIServerPort = 0
	host, _ := splitPort(t, cfg.InlineOPAConfig.Addr)
	c.InlineOPAConfig.Addr = net.JoinHostPort(host, "0")

	ctx, cancel := context.WithCancel(context.Background())
	txs := make(chan status.Transaction, 64)
	a, err := agent.New(ctx, agent.Options{Config: &c, Logger: slog.New(slog.DiscardHandler), Version: "test",
		NewDataUpdater: agent.NewDataUpdater, OnTransaction: func(tx status.Transaction) { txs <- tx }})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("agent did not stop")
		}
	}()
	dl := time.NewTimer(60 * time.Second)
	defer dl.Stop()
	for loaded := false; !loaded; {
		select {
		case tx := <-txs:
			loaded = tx.Success && tx.Type == "policy"
		case err := <-done:
			t.Fatalf("agent stopped: %v", err)
		case <-dl.C:
			t.Fatal("no policy loaded in time")
		}
	}
	_, apiPort := splitPort(t, a.APIAddr())
	_, opaPort := splitPort(t, a.OPAAddr())
	hc := &http.Client{Timeout: 10 * time.Second}
	get := func(p string) int {
		r, err := hc.Get("http://127.0.0.1:" + strconv.Itoa(apiPort) + p)
		if err != nil {
			t.Fatalf("GET %s: %v", p, err)
		}
		r.Body.Close()
		return r.StatusCode
	}
	for _, p := range paths {
		if code := get(p); code != http.StatusOK {
			t.Errorf("GET %s = %d, want 200", p, code)
		}
	}
	if code := get("/no-such-probe"); code != http.StatusNotFound {
		t.Errorf("GET /no-such-probe = %d: the probe check cannot fail", code)
	}
	r, err := hc.Post("http://127.0.0.1:"+strconv.Itoa(opaPort)+"/v1/data/app/rbac/allow", "application/json",
		strings.NewReader(`{"input":{"user":"bob","action":"write","resource":"documents"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r.Body)
	r.Body.Close()
	if strings.TrimSpace(string(b)) != `{"result":true}` {
		t.Errorf("decision %s, want {\"result\":true}", b)
	}
}
