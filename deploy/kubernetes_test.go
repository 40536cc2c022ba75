package deploy_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/keepwarm/keepwarm/internal/config"
	"github.com/keepwarm/keepwarm/internal/server"
	"github.com/keepwarm/keepwarm/warmer"
)

// kustomization is the part of kustomize's Kustomization that deploy/kubernetes uses; decoding is strict, so a
// field this struct does not know fails the test (add it here when the kustomization grows).
type kustomization struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Labels     []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
	Resources []string `json:"resources"`
}

// k8sManifests decodes every file of deploy/kubernetes strictly (unknown or duplicate fields are errors) into the
// Kubernetes API type of its kind, and checks that kustomization.yaml lists exactly the other files.
func k8sManifests(t *testing.T) (dep *appsv1.Deployment, cm *corev1.ConfigMap, sec *corev1.Secret, svc *corev1.Service, pm *monitoringv1.PodMonitor, pdb *policyv1.PodDisruptionBudget) {
	t.Helper()
	dir := filepath.Join(root, "deploy", "kubernetes")
	var k kustomization
	if err := yaml.UnmarshalStrict(read(t, "deploy/kubernetes/kustomization.yaml"), &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("kustomization.yaml: %s %s, want kustomize.config.k8s.io/v1beta1 Kustomization", k.APIVersion, k.Kind)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var others []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			others = append(others, b)
		}
	}
	if got := slices.Sorted(slices.Values(k.Resources)); !slices.Equal(got, others) {
		t.Errorf("kustomization resources %q, want every other file %q", got, others)
	}
	for _, name := range k.Resources {
		raw := read(t, "deploy/kubernetes/"+name)
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal(raw, &meta); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var obj any
		switch gvk := meta.APIVersion + " " + meta.Kind; gvk {
		case "apps/v1 Deployment":
			dep = &appsv1.Deployment{}
			obj = dep
		case "v1 ConfigMap":
			cm = &corev1.ConfigMap{}
			obj = cm
		case "v1 Secret":
			sec = &corev1.Secret{}
			obj = sec
		case "v1 Service":
			svc = &corev1.Service{}
			obj = svc
		case "monitoring.coreos.com/v1 PodMonitor":
			pm = &monitoringv1.PodMonitor{}
			obj = pm
		case "policy/v1 PodDisruptionBudget":
			pdb = &policyv1.PodDisruptionBudget{}
			obj = pdb
		default:
			t.Fatalf("%s: unexpected kind %q", name, gvk)
		}
		if err := yaml.UnmarshalStrict(raw, obj); err != nil {
			t.Fatalf("%s: strict decode into %T: %v", name, obj, err)
		}
	}
	if dep == nil || cm == nil || sec == nil || svc == nil || pm == nil || pdb == nil {
		t.Fatalf("deploy/kubernetes needs a Deployment, ConfigMap, Secret, Service, PodMonitor and PodDisruptionBudget")
	}
	return dep, cm, sec, svc, pm, pdb
}

func TestKubernetesStrictDecodeCatchesTypos(t *testing.T) {
	// The check itself: a misspelt field must fail, or the manifests test proves nothing.
	bad := []byte("apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n")
	if err := yaml.UnmarshalStrict(bad, &appsv1.Deployment{}); err == nil || !strings.Contains(err.Error(), `unknown field "replica"`) {
		t.Errorf("strict decode of spec.replica: %v, want an unknown-field error", err)
	}
}

func TestKubernetesManifests(t *testing.T) {
	dep, cm, sec, svc, pm, pdb := k8sManifests(t)
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", dep.Spec.Replicas)
	}
	pod := dep.Spec.Template.Spec

	t.Run("a fleet: no disruption or rollout takes the last warm member down", func(t *testing.T) {
		podLabels := dep.Spec.Template.Labels
		matches := func(sel *metav1.LabelSelector) bool {
			if sel == nil || len(sel.MatchLabels) == 0 || len(sel.MatchExpressions) > 0 {
				return false
			}
			for k, v := range sel.MatchLabels {
				if podLabels[k] != v {
					return false
				}
			}
			return true
		}
		// The budget keeps one replica up through drains: minAvailable 1 of 2 (or maxUnavailable 1), selecting
		// exactly the Deployment's pods.
		switch {
		case !matches(pdb.Spec.Selector):
			t.Errorf("PodDisruptionBudget selector %+v does not select the pods %v", pdb.Spec.Selector, podLabels)
		case pdb.Spec.MinAvailable != nil && (pdb.Spec.MinAvailable.IntValue() < 1 || pdb.Spec.MinAvailable.IntValue() >= int(*dep.Spec.Replicas)):
			t.Errorf("PodDisruptionBudget minAvailable %v: want at least 1 and fewer than the %d replicas (else no drain can proceed)",
				pdb.Spec.MinAvailable, *dep.Spec.Replicas)
		case pdb.Spec.MinAvailable == nil && (pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1):
			t.Errorf("PodDisruptionBudget: want minAvailable 1 or maxUnavailable 1, got %+v", pdb.Spec)
		}
		// A rollout starts the new pod and waits for it to be ready before it stops an old one.
		ru := dep.Spec.Strategy.RollingUpdate
		if dep.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType || ru == nil || ru.MaxUnavailable == nil ||
			ru.MaxUnavailable.IntValue() != 0 || ru.MaxSurge == nil || ru.MaxSurge.IntValue() < 1 {
			t.Errorf("strategy %+v: want a RollingUpdate with maxUnavailable 0 and maxSurge >= 1", dep.Spec.Strategy)
		}
		// The replicas land on different nodes: a hard spread over hostnames, selecting the pods.
		spread := false
		for _, c := range pod.TopologySpreadConstraints {
			if c.TopologyKey == "kubernetes.io/hostname" && c.MaxSkew == 1 && c.WhenUnsatisfiable == corev1.DoNotSchedule && matches(c.LabelSelector) {
				spread = true
			}
		}
		if !spread {
			t.Errorf("topologySpreadConstraints %+v: want maxSkew 1 over kubernetes.io/hostname, DoNotSchedule, selecting the pods", pod.TopologySpreadConstraints)
		}
		// The kubelet's SIGKILL comes after the warmer's own grace for in-flight refreshes, with room to release
		// the locks and the stream lease.
		if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < warmer.DefaultGrace+5*time.Second {
			t.Errorf("terminationGracePeriodSeconds %v: want at least the warmer's grace %v + 5 s", g, warmer.DefaultGrace)
		}
	})
	if len(pod.Containers) != 1 {
		t.Fatalf("containers: %d, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	if got := strings.Join(c.Args, " "); got != "--config /etc/keepwarm/config.toml" {
		t.Errorf("args %q", got)
	}

	t.Run("security context: non-root, read-only root, no privileges", func(t *testing.T) {
		psc, sc := pod.SecurityContext, c.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
			t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", psc)
		}
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("container securityContext %+v: want readOnlyRootFilesystem, no privilege escalation, drop ALL", sc)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
		}
	})

	// The ConfigMap, mounted as the Deployment mounts it, with the Secret's environment, is a config keepwarm
	// loads; its listen port is the container's http port.
	dir := t.TempDir()
	var mount *corev1.Volume
	for i, v := range pod.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
			mount = &pod.Volumes[i]
		}
	}
	if mount == nil {
		t.Fatalf("no volume mounts ConfigMap %s", cm.Name)
	}
	for _, it := range mount.ConfigMap.Items {
		data, ok := cm.Data[it.Key]
		if !ok {
			t.Fatalf("volume item %s: no such key in the ConfigMap", it.Key)
		}
		p := filepath.Join(dir, it.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == mount.Name && m.MountPath == "/etc/keepwarm" && m.ReadOnly
	}) {
		t.Errorf("volume %s is not mounted read-only at /etc/keepwarm: %+v", mount.Name, c.VolumeMounts)
	}
	if !slices.ContainsFunc(c.EnvFrom, func(e corev1.EnvFromSource) bool {
		return e.SecretRef != nil && e.SecretRef.Name == sec.Name
	}) {
		t.Errorf("the container does not take its environment from Secret %s", sec.Name)
	}
	for k, v := range sec.StringData {
		if !strings.HasPrefix(k, "KEEPWARM_") {
			t.Errorf("Secret key %s is not a KEEPWARM_ setting", k)
		}
		t.Setenv(k, v)
	}
	t.Setenv("KEEPWARM_REDIS_URL", "") // the test environment's own must not leak into the check
	cfg, err := config.Load(filepath.Join(dir, "config.toml"))
	if err != nil {
		t.Fatalf("the ConfigMap's config.toml, mounted as the Deployment does: %v", err)
	}
	_, listenPort, err := net.SplitHostPort(cfg.Daemon.Listen)
	if err != nil {
		t.Fatal(err)
	}
	if ip := net.ParseIP(strings.Split(cfg.Daemon.Listen, ":")[0]); ip == nil || !ip.IsUnspecified() {
		t.Errorf("daemon.listen = %q: the kubelet probes the pod's IP, so it must listen on all interfaces", cfg.Daemon.Listen)
	}
	var httpPort int32
	for _, p := range c.Ports {
		if p.Name == "http" {
			httpPort = p.ContainerPort
		}
	}
	if strconv.Itoa(int(httpPort)) != listenPort {
		t.Errorf("container port http = %d, daemon.listen port %s", httpPort, listenPort)
	}

	t.Run("probes: liveness on /livez, readiness on /readyz, both served", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			probe *corev1.Probe
			path  string
		}{
			{"livenessProbe", c.LivenessProbe, "/livez"},
			{"readinessProbe", c.ReadinessProbe, "/readyz"},
		} {
			if tc.probe == nil || tc.probe.HTTPGet == nil {
				t.Errorf("%s: want an httpGet probe", tc.name)
				continue
			}
			g := tc.probe.HTTPGet
			if g.Path != tc.path || g.Port.String() != "http" {
				t.Errorf("%s: GET %s on port %s, want %s on port http", tc.name, g.Path, g.Port.String(), tc.path)
			}
			// The daemon's own handlers answer the path (not 404): alive, and not ready.
			code := serverStatus(t, g.Path)
			if code == http.StatusNotFound || code == 0 {
				t.Errorf("%s: the daemon answers GET %s with %d", tc.name, g.Path, code)
			}
		}
		// /readyz takes up to server.ReadyTimeout; the probe must wait longer, or it fails a slow but ready pod.
		if r := c.ReadinessProbe; r != nil && int64(r.TimeoutSeconds)*1e9 <= int64(server.ReadyTimeout) {
			t.Errorf("readinessProbe timeoutSeconds %d: want more than /readyz's own bound %v", r.TimeoutSeconds, server.ReadyTimeout)
		}
	})

	t.Run("service and pod monitor select the pods by the http port", func(t *testing.T) {
		labels := dep.Spec.Template.Labels
		for k, v := range dep.Spec.Selector.MatchLabels {
			if labels[k] != v {
				t.Errorf("Deployment selector %s=%s does not match the pod labels %v", k, v, labels)
			}
		}
		for k, v := range svc.Spec.Selector {
			if labels[k] != v {
				t.Errorf("Service selector %s=%s does not match the pod labels %v", k, v, labels)
			}
		}
		if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].TargetPort.String() != "http" {
			t.Errorf("Service ports %+v, want one targeting port http", svc.Spec.Ports)
		}
		for k, v := range pm.Spec.Selector.MatchLabels {
			if labels[k] != v {
				t.Errorf("PodMonitor selector %s=%s does not match the pod labels %v", k, v, labels)
			}
		}
		if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port == nil ||
			*pm.Spec.PodMetricsEndpoints[0].Port != "http" || pm.Spec.PodMetricsEndpoints[0].Path != "/metrics" {
			t.Errorf("PodMonitor endpoints %+v, want /metrics on port http", pm.Spec.PodMetricsEndpoints)
		}
	})
}

// serverStatus serves the daemon's HTTP handlers (internal/server, not ready: its dependencies are down) on a
// free port and returns the status of GET path.
func serverStatus(t *testing.T, path string) int {
	t.Helper()
	s, err := server.New(server.Config{Addr: "127.0.0.1:0", Gatherer: prometheus.NewRegistry(),
		Ready: func(context.Context) error { return errors.New("redis: no answer within 500ms") }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	resp, err := http.Get("http://" + s.Addr() + path)
	if err != nil {
		t.Errorf("GET %s: %v", path, err)
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
