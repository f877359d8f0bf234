package deploy

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/redis/rueidis"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The names the manifests and the binary agree on.
const (
	grpcPort        = 7420
	metricsPort     = 7421
	healthPort      = 7422
	readyService    = "fenced" // follows Redis
	livenessService = "liveness"
	fencedName      = "fenced" // the Deployment, its container, HPA, PDB
	redisURLEnv     = "FENCED_REDIS_URL"
	nonrootUID      = 65532 // distroless nonroot, ../Dockerfile's USER
)

// runtimeEnv are the environment variables the Go runtime reads; a
// Deployment may set them beside fenced's own, and OTEL_* ones, which the
// OpenTelemetry SDK reads (fenced serve --help: --otlp-endpoint).
var runtimeEnv = []string{"GOMEMLIMIT", "GOMAXPROCS", "GOGC", "GODEBUG"}

// otherEnv reports whether name is read by the Go runtime or OpenTelemetry
// rather than by fenced's flags.
func otherEnv(name string) bool {
	return slices.Contains(runtimeEnv, name) || strings.HasPrefix(name, "OTEL_")
}

// newObject returns an empty typed object for each apiVersion and kind the
// manifests may hold; any other kind fails the test.
var newObject = map[string]func() any{
	"v1/Namespace":                  func() any { return &corev1.Namespace{} },
	"v1/ServiceAccount":             func() any { return &corev1.ServiceAccount{} },
	"v1/ConfigMap":                  func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                     func() any { return &corev1.Secret{} },
	"v1/Service":                    func() any { return &corev1.Service{} },
	"apps/v1/Deployment":            func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":           func() any { return &appsv1.StatefulSet{} },
	"policy/v1/PodDisruptionBudget": func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() any {
		return &autoscalingv2.HorizontalPodAutoscaler{}
	},
	"networking.k8s.io/v1/NetworkPolicy": func() any { return &networkingv1.NetworkPolicy{} },
	// The Prometheus Operator's, from components/monitoring.
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
}

// decodeStrict decodes one object's YAML into the API type of its kind as
// the API server's strict field validation does: field names are matched
// case-sensitively (encoding/json would take readOnlyRootFileSystem for
// readOnlyRootFilesystem), and an unknown or duplicate field is an error.
func decodeStrict(y []byte) (any, error) {
	j, err := yaml.YAMLToJSONStrict(y)
	if err != nil {
		return nil, err
	}
	var tm metav1.TypeMeta
	if err := json.UnmarshalCaseSensitivePreserveInts(j, &tm); err != nil {
		return nil, err
	}
	mk, ok := newObject[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("unexpected kind %s %s", tm.APIVersion, tm.Kind)
	}
	obj := mk()
	strict, err := json.UnmarshalStrict(j, obj)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	if len(strict) > 0 {
		return nil, fmt.Errorf("%s: %w", tm.Kind, errors.Join(strict...))
	}
	return obj, nil
}

// TestDecodeStrict: the decoder the manifests go through refuses unknown
// and misplaced fields and unknown kinds, so that the tests below cannot
// pass on a typo.
func TestDecodeStrict(t *testing.T) {
	tests := []struct {
		name string
		y    string
		ok   bool
	}{
		{"known", "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: 2\n", true},
		{"unknown field", "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n", false},
		{"field in another case", "apiVersion: apps/v1\nkind: Deployment\nspec:\n  Replicas: 2\n", false},
		{"misplaced field", "apiVersion: apps/v1\nkind: Deployment\nspec:\n  template:\n    spec:\n      containers:\n      - name: a\n        readOnlyRootFilesystem: true\n", false},
		{"wrong type", "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: two\n", false},
		{"duplicate key", "apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: 2\n  replicas: 3\n", false},
		{"unknown kind", "apiVersion: v1\nkind: Pod\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := decodeStrict([]byte(tt.y))
			if (err == nil) != tt.ok {
				t.Errorf("decodeStrict(%q) error = %v, want ok %v", tt.y, err, tt.ok)
			}
		})
	}
}

// rendered is what one kustomization renders to, decoded.
type rendered struct {
	dir     string
	objects []any
}

// render runs kustomize (the Go API kubectl kustomize uses) on dir and
// decodes every object strictly.
func render(t *testing.T, dir string) *rendered {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	r := &rendered{dir: dir}
	for _, res := range rm.Resources() {
		y, err := res.AsYAML()
		if err != nil {
			t.Fatalf("kustomize build %s: %s: %v", dir, res.CurId(), err)
		}
		obj, err := decodeStrict(y)
		if err != nil {
			t.Errorf("kustomize build %s: %s: %v\n%s", dir, res.CurId(), err, y)
			continue
		}
		r.objects = append(r.objects, obj)
	}
	if t.Failed() {
		t.FailNow()
	}
	return r
}

// all returns the objects of type T.
func all[T any](r *rendered) []T {
	var out []T
	for _, o := range r.objects {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// one returns the object of type T named name, failing the test if there
// is none.
func one[T interface{ GetName() string }](t *testing.T, r *rendered, name string) T {
	t.Helper()
	for _, v := range all[T](r) {
		if v.GetName() == name {
			return v
		}
	}
	var zero T
	t.Fatalf("%s renders no %T named %q", r.dir, zero, name)
	return zero
}

// byName returns the object of type T named name, if any.
func byName[T interface{ GetName() string }](r *rendered, name string) (T, bool) {
	for _, v := range all[T](r) {
		if v.GetName() == name {
			return v, true
		}
	}
	var zero T
	return zero, false
}

// kustomizations are base and every overlay; complete says the result is
// meant to be applied as it is (every reference resolves within it).
func kustomizations(t *testing.T) map[string]bool {
	t.Helper()
	dirs := map[string]bool{"base": false}
	overlays, err := filepath.Glob("overlays/*/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range overlays {
		dirs[filepath.Dir(k)] = true
	}
	for _, want := range []string{"overlays/standalone-redis", "overlays/redis-cluster"} {
		if !dirs[want] {
			t.Errorf("no %s/kustomization.yaml", want)
		}
	}
	// Every overlay again with the monitoring component, as an operator
	// includes it.
	for dir := range maps.Clone(dirs) {
		name, ok := strings.CutPrefix(dir, "overlays/")
		if !ok {
			continue
		}
		monitored := filepath.Join(monitoredDir, name)
		if _, err := os.Stat(filepath.Join(monitored, "kustomization.yaml")); err != nil {
			t.Errorf("no %s/kustomization.yaml: every overlay is rendered with %s (%v)", monitored, monitoringComponent, err)
			continue
		}
		dirs[monitored] = true
	}
	return dirs
}

// monitoredDir holds one kustomization per overlay: the overlay with the
// monitoring component.
const monitoredDir = "testdata/monitored"

// TestManifests renders base and every overlay and checks each against the
// fenced binary and the rules of a well-run gRPC service.
func TestManifests(t *testing.T) {
	flags := serveFlags(t)
	for dir, complete := range kustomizations(t) {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			d := one[*appsv1.Deployment](t, r, fencedName)
			checkDeployment(t, r, d, flags, complete)
			checkServices(t, r, d)
			checkPDBAndHPA(t, r, d)
			checkNetworkPolicy(t, r, d)
			checkWorkloadsRestricted(t, r)
			if complete {
				checkNamespace(t, r)
			}
			if strings.HasPrefix(dir, monitoredDir+"/") {
				checkMonitoring(t, r, d)
			} else if n := len(all[*monitoringv1.ServiceMonitor](r)) + len(all[*monitoringv1.PrometheusRule](r)); n > 0 {
				t.Errorf("%s renders %d Prometheus Operator object(s): the overlays must apply on clusters without its CRDs; include %s instead", dir, n, monitoringComponent)
			}
		})
	}
}

// fencedContainer returns the Deployment's fenced container.
func fencedContainer(t *testing.T, d *appsv1.Deployment) *corev1.Container {
	t.Helper()
	for i := range d.Spec.Template.Spec.Containers {
		if c := &d.Spec.Template.Spec.Containers[i]; c.Name == fencedName {
			return c
		}
	}
	t.Fatalf("Deployment %s has no container %q", d.Name, fencedName)
	return nil
}

// containerEnv resolves the environment a container gets from env and
// envFrom: name to value, "" where it comes from a Secret or a field. In a
// complete render every ConfigMap or Secret it names must exist (unless
// optional) and hold the key.
func containerEnv(t *testing.T, r *rendered, c *corev1.Container, complete bool) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, ok := byName[*corev1.ConfigMap](r, from.ConfigMapRef.Name)
			if !ok {
				t.Errorf("container %s: envFrom ConfigMap %q is not rendered", c.Name, from.ConfigMapRef.Name)
				continue
			}
			for k, v := range cm.Data {
				env[from.Prefix+k] = v
			}
		case from.SecretRef != nil:
			s, ok := byName[*corev1.Secret](r, from.SecretRef.Name)
			if !ok {
				t.Errorf("container %s: envFrom Secret %q is not rendered", c.Name, from.SecretRef.Name)
				continue
			}
			for k := range s.Data {
				env[from.Prefix+k] = ""
			}
			for k := range s.StringData {
				env[from.Prefix+k] = ""
			}
		}
	}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom == nil {
			continue
		}
		switch ref := e.ValueFrom; {
		case ref.ConfigMapKeyRef != nil:
			cm, ok := byName[*corev1.ConfigMap](r, ref.ConfigMapKeyRef.Name)
			if ok {
				env[e.Name] = cm.Data[ref.ConfigMapKeyRef.Key]
			}
			if complete && (!ok || !hasKey(cm.Data, ref.ConfigMapKeyRef.Key)) && !ptrTrue(ref.ConfigMapKeyRef.Optional) {
				t.Errorf("container %s: env %s: ConfigMap %q key %q is not rendered", c.Name, e.Name, ref.ConfigMapKeyRef.Name, ref.ConfigMapKeyRef.Key)
			}
		case ref.SecretKeyRef != nil:
			s, ok := byName[*corev1.Secret](r, ref.SecretKeyRef.Name)
			if complete && (!ok || !hasKey(secretData(s), ref.SecretKeyRef.Key)) && !ptrTrue(ref.SecretKeyRef.Optional) {
				t.Errorf("container %s: env %s: Secret %q key %q is not rendered", c.Name, e.Name, ref.SecretKeyRef.Name, ref.SecretKeyRef.Key)
			}
		}
	}
	return env
}

func hasKey[V any](m map[string]V, k string) bool {
	_, ok := m[k]
	return ok
}

func ptrTrue(b *bool) bool { return b != nil && *b }

// deref formats what p points to, "<nil>" for nil.
func deref[T any](p *T) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprint(*p)
}

// secretData is a Secret's data, with stringData merged in as the API
// server does.
func secretData(s *corev1.Secret) map[string]string {
	out := map[string]string{}
	if s == nil {
		return out
	}
	for k, v := range s.Data {
		out[k] = string(v)
	}
	maps.Copy(out, s.StringData)
	return out
}

// setting returns the value fenced runs with for flag: the container's
// environment (the first of the flag's variables that is set, as kong
// reads them), else the flag's default.
func setting(env map[string]string, f flagInfo) string {
	for _, name := range f.envs {
		if v, ok := env[name]; ok {
			return v
		}
	}
	return f.def
}

func duration(t *testing.T, what, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s = %q: %v", what, s, err)
	}
	return d
}

func checkDeployment(t *testing.T, r *rendered, d *appsv1.Deployment, flags map[string]flagInfo, complete bool) {
	spec := &d.Spec.Template.Spec
	if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
		t.Errorf("Deployment %s replicas = %v, want >= 2", d.Name, deref(d.Spec.Replicas))
	}
	sel, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	if err != nil || sel.Empty() || !sel.Matches(labels.Set(d.Spec.Template.Labels)) {
		t.Errorf("Deployment %s selector %v does not select its pod template's labels %v (%v)", d.Name, d.Spec.Selector, d.Spec.Template.Labels, err)
	}
	c := fencedContainer(t, d)

	// The image: pinned, not latest.
	if c.Image == "" || c.Image == fencedName || strings.HasSuffix(c.Image, ":latest") {
		t.Errorf("container %s image = %q, want a registry path with a tag or digest, not latest", c.Name, c.Image)
	}
	if len(c.Command) != 0 || len(c.Args) != 0 {
		t.Errorf("container %s command %q args %q, want none (the image runs fenced serve)", c.Name, c.Command, c.Args)
	}

	// Ports: gRPC and metrics, named, as the flags' defaults and the
	// environment say.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
		if p.Protocol != corev1.ProtocolTCP {
			t.Errorf("container %s port %s protocol %q, want TCP", c.Name, p.Name, p.Protocol)
		}
	}
	if want := map[string]int32{"grpc": grpcPort, "metrics": metricsPort, "health": healthPort}; !maps.Equal(ports, want) {
		t.Errorf("container %s ports = %v, want %v", c.Name, ports, want)
	}
	env := containerEnv(t, r, c, complete)
	if got := portOf(t, "fenced serve --listen default", flags["listen"].def); got != grpcPort {
		t.Errorf("fenced serve --listen default port = %d, want %d", got, grpcPort)
	}
	if got := portOf(t, "the gRPC listen address", setting(env, flags["listen"])); got != ports["grpc"] {
		t.Errorf("container %s: fenced listens for gRPC on %d (--listen %q), the grpc port is %d", c.Name, got, setting(env, flags["listen"]), ports["grpc"])
	}
	if mf, ok := flags["metrics-listen"]; !ok {
		t.Errorf("the Deployment declares a metrics port %d, but fenced serve has no --metrics-listen", metricsPort)
	} else {
		if got := portOf(t, "fenced serve --metrics-listen default", mf.def); got != metricsPort {
			t.Errorf("fenced serve --metrics-listen default port = %d, want %d", got, metricsPort)
		}
		if got := portOf(t, "the metrics listen address", setting(env, mf)); got != ports["metrics"] {
			t.Errorf("container %s: fenced serves metrics on %d (--metrics-listen %q), the metrics port is %d", c.Name, got, setting(env, mf), ports["metrics"])
		}
	}

	// Probes reach health on its own plaintext listener: the kubelet's gRPC
	// probes cannot speak TLS, and the gRPC port may.
	if hf, ok := flags["health-listen"]; !ok {
		t.Errorf("the Deployment declares a health port %d, but fenced serve has no --health-listen", healthPort)
	} else if got := portOf(t, "the health listen address", setting(env, hf)); got != ports["health"] {
		t.Errorf("container %s: fenced serves health alone on %d (--health-listen %q), the health port is %d", c.Name, got, setting(env, hf), ports["health"])
	}

	// Environment: fenced's own variables (or the Go runtime's), the Redis
	// URL from a Secret only.
	known := envFlags(flags)
	for _, name := range slices.Sorted(maps.Keys(env)) {
		if _, ok := known[name]; !ok && !otherEnv(name) {
			t.Errorf("container %s sets %s, which fenced serve does not read (known: %q)", c.Name, name, slices.Sorted(maps.Keys(known)))
		}
	}
	redisFromSecret := false
	for _, e := range c.Env {
		if e.Name == redisURLEnv {
			redisFromSecret = e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && !ptrTrue(e.ValueFrom.SecretKeyRef.Optional)
		}
	}
	if !redisFromSecret {
		t.Errorf("container %s: %s is not set from a required Secret key (without it fenced serves from an embedded, non-durable Redis)", c.Name, redisURLEnv)
	}
	for _, name := range known[redisURLEnv].envs {
		for _, from := range c.EnvFrom {
			if from.ConfigMapRef != nil {
				if cm, ok := byName[*corev1.ConfigMap](r, from.ConfigMapRef.Name); ok && hasKey(cm.Data, strings.TrimPrefix(name, from.Prefix)) {
					t.Errorf("ConfigMap %s holds %s: the Redis URL may carry a password, keep it in a Secret", cm.Name, name)
				}
			}
		}
	}
	if complete {
		checkRedisURL(t, r, c)
	}

	// Probes: native gRPC on the health port; readiness on the service that
	// follows Redis, liveness on the process alone.
	for _, p := range []struct {
		name    string
		probe   *corev1.Probe
		service string
	}{
		{"readinessProbe", c.ReadinessProbe, readyService},
		{"livenessProbe", c.LivenessProbe, livenessService},
	} {
		switch {
		case p.probe == nil || p.probe.GRPC == nil:
			t.Errorf("container %s %s = %+v, want a grpc probe", c.Name, p.name, p.probe)
		case p.probe.GRPC.Port != ports["health"] || p.probe.GRPC.Service == nil || *p.probe.GRPC.Service != p.service:
			t.Errorf("container %s %s grpc = {port %d, service %q}, want {port %d, service %q}", c.Name, p.name, p.probe.GRPC.Port, deref(p.probe.GRPC.Service), ports["health"], p.service)
		}
	}
	if c.StartupProbe != nil {
		t.Errorf("container %s has a startupProbe: fenced starts at once, and a startup probe delays liveness", c.Name)
	}

	// Termination: the grace period outlasts the drain delay and the
	// graceful stop.
	drain := duration(t, "drain delay", setting(env, flags["drain-delay"]))
	stop := duration(t, "shutdown timeout", setting(env, flags["shutdown-timeout"]))
	if spec.TerminationGracePeriodSeconds == nil || time.Duration(*spec.TerminationGracePeriodSeconds)*time.Second <= drain+stop {
		t.Errorf("Deployment %s terminationGracePeriodSeconds = %s, want more than the drain delay %v + the shutdown timeout %v", d.Name, deref(spec.TerminationGracePeriodSeconds), drain, stop)
	}

	// Scheduling: replicas spread across nodes.
	if !spreadsAcrossNodes(d) {
		t.Errorf("Deployment %s: no topologySpreadConstraint or podAntiAffinity on kubernetes.io/hostname that selects its pods", d.Name)
	}

	// Identity: its own service account, no API token, no service links.
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("Deployment %s automountServiceAccountToken = %s, want false", d.Name, deref(spec.AutomountServiceAccountToken))
	}
	sa, ok := byName[*corev1.ServiceAccount](r, spec.ServiceAccountName)
	if !ok || sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("Deployment %s serviceAccountName %q: want a rendered ServiceAccount with automountServiceAccountToken false", d.Name, spec.ServiceAccountName)
	}
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Errorf("Deployment %s enableServiceLinks = %s, want false (a Service named fenced... would add FENCED_* variables)", d.Name, deref(spec.EnableServiceLinks))
	}
	if uid := spec.SecurityContext.RunAsUser; uid == nil || *uid != nonrootUID {
		t.Errorf("Deployment %s runAsUser = %s, want %d (the image's USER)", d.Name, deref(uid), nonrootUID)
	}

	// TLS material: from an optional Secret volume, mounted read-only.
	tls := false
	for _, v := range spec.Volumes {
		if v.Secret != nil && v.Secret.Optional != nil && *v.Secret.Optional {
			for _, m := range c.VolumeMounts {
				tls = tls || (m.Name == v.Name && m.ReadOnly)
			}
		}
	}
	if !tls {
		t.Errorf("container %s mounts no optional Secret volume read-only (TLS material)", c.Name)
	}
}

// checkRedisURL: the URL the Secret gives fenced parses as rueidis parses
// it; in a render with its own Redis it names that Redis's Service and
// port, otherwise several seeds of a Redis Cluster.
func checkRedisURL(t *testing.T, r *rendered, c *corev1.Container) {
	var ref *corev1.SecretKeySelector
	for _, e := range c.Env {
		if e.Name == redisURLEnv && e.ValueFrom != nil {
			ref = e.ValueFrom.SecretKeyRef
		}
	}
	if ref == nil {
		return // reported by the caller
	}
	s, _ := byName[*corev1.Secret](r, ref.Name)
	url := secretData(s)[ref.Key]
	if url != strings.TrimSpace(url) {
		t.Errorf("Secret %s key %s = %q: white space around the URL", ref.Name, ref.Key, url)
	}
	opt, err := rueidis.ParseURL(url)
	if err != nil {
		t.Errorf("Secret %s key %s = %q: rueidis.ParseURL: %v", ref.Name, ref.Key, url, err)
		return
	}
	if ss := all[*appsv1.StatefulSet](r); len(ss) > 0 {
		if len(opt.InitAddress) != 1 {
			t.Fatalf("Redis URL %q names %d addresses, want the one Redis this overlay runs", url, len(opt.InitAddress))
		}
		host, port, _ := net.SplitHostPort(opt.InitAddress[0])
		svc, ok := byName[*corev1.Service](r, host)
		if !ok {
			t.Fatalf("Redis URL %q: no Service %q rendered", url, host)
		}
		found := false
		for _, p := range svc.Spec.Ports {
			found = found || strconv.Itoa(int(p.Port)) == port
		}
		if !found {
			t.Errorf("Redis URL %q: Service %s has no port %s", url, host, port)
		}
		checkRedisStatefulSet(t, r, svc)
		return
	}
	if len(opt.InitAddress) < 2 {
		t.Errorf("Redis URL %q names %d address(es), want several Redis Cluster seeds (addr=)", url, len(opt.InitAddress))
	}
}

// checkRedisStatefulSet: the Service's Redis is a StatefulSet of one with
// an append-only file on a persistent volume, fsynced every second or
// always, and never evicts.
func checkRedisStatefulSet(t *testing.T, r *rendered, svc *corev1.Service) {
	var ss *appsv1.StatefulSet
	for _, s := range all[*appsv1.StatefulSet](r) {
		if labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(s.Spec.Template.Labels)) {
			ss = s
		}
	}
	if ss == nil {
		t.Fatalf("Service %s selects no StatefulSet's pods", svc.Name)
	}
	if ss.Spec.Replicas == nil || *ss.Spec.Replicas != 1 {
		t.Errorf("StatefulSet %s replicas = %s, want 1 (one Redis primary)", ss.Name, deref(ss.Spec.Replicas))
	}
	if _, ok := byName[*corev1.Service](r, ss.Spec.ServiceName); !ok {
		t.Errorf("StatefulSet %s serviceName %q is not rendered", ss.Name, ss.Spec.ServiceName)
	}
	c := ss.Spec.Template.Spec.Containers[0]
	args := map[string]string{}
	for i := 0; i+1 < len(c.Args); i++ {
		if strings.HasPrefix(c.Args[i], "--") {
			args[c.Args[i]] = c.Args[i+1]
		}
	}
	if args["--appendonly"] != "yes" || (args["--appendfsync"] != "everysec" && args["--appendfsync"] != "always") {
		t.Errorf("StatefulSet %s redis args %q, want --appendonly yes --appendfsync everysec|always", ss.Name, c.Args)
	}
	if p := args["--maxmemory-policy"]; p != "" && p != "noeviction" {
		t.Errorf("StatefulSet %s --maxmemory-policy %s, want noeviction: fenced's records must never be evicted", ss.Name, p)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		for _, pvc := range ss.Spec.VolumeClaimTemplates {
			mounted = mounted || (m.Name == pvc.Name && m.MountPath == args["--dir"])
		}
	}
	if !mounted {
		t.Errorf("StatefulSet %s: --dir %q is not a mounted volumeClaimTemplate", ss.Name, args["--dir"])
	}
}

// spreadsAcrossNodes reports whether d's pods are spread over nodes, by a
// topology spread constraint or a pod anti-affinity that selects them.
func spreadsAcrossNodes(d *appsv1.Deployment) bool {
	pods := labels.Set(d.Spec.Template.Labels)
	selects := func(ls *metav1.LabelSelector) bool {
		s, err := metav1.LabelSelectorAsSelector(ls)
		return err == nil && !s.Empty() && s.Matches(pods)
	}
	spec := d.Spec.Template.Spec
	for _, c := range spec.TopologySpreadConstraints {
		if c.TopologyKey == corev1.LabelHostname && selects(c.LabelSelector) {
			return true
		}
	}
	if a := spec.Affinity; a != nil && a.PodAntiAffinity != nil {
		for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			if term.TopologyKey == corev1.LabelHostname && selects(term.LabelSelector) {
				return true
			}
		}
		for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
			if w.PodAffinityTerm.TopologyKey == corev1.LabelHostname && selects(w.PodAffinityTerm.LabelSelector) {
				return true
			}
		}
	}
	return false
}

// podLabels are the pod template labels of every workload rendered, by
// "Kind/name".
func podLabels(r *rendered) map[string]labels.Set {
	out := map[string]labels.Set{}
	for _, d := range all[*appsv1.Deployment](r) {
		out["Deployment/"+d.Name] = d.Spec.Template.Labels
	}
	for _, s := range all[*appsv1.StatefulSet](r) {
		out["StatefulSet/"+s.Name] = s.Spec.Template.Labels
	}
	return out
}

// selected returns the workloads whose pods sel matches.
func selected(r *rendered, sel labels.Selector) []string {
	var out []string
	for name, l := range podLabels(r) {
		if !sel.Empty() && sel.Matches(l) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// checkServices: every Service that selects fenced's pods selects them
// alone, and each of its ports targets a container port of the same number.
func checkServices(t *testing.T, r *rendered, d *appsv1.Deployment) {
	c := fencedContainer(t, d)
	byPort := map[string]int32{}
	for _, p := range c.Ports {
		byPort[p.Name] = p.ContainerPort
		byPort[strconv.Itoa(int(p.ContainerPort))] = p.ContainerPort
	}
	want := []string{"Deployment/" + d.Name}
	grpcServed := false
	for _, svc := range all[*corev1.Service](r) {
		got := selected(r, labels.SelectorFromSet(svc.Spec.Selector))
		if !slices.Contains(got, want[0]) {
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf("Service %s selects the pods of %q, want %q alone", svc.Name, got, want)
		}
		for _, p := range svc.Spec.Ports {
			target := p.TargetPort
			if target == (intstr.IntOrString{}) {
				target = intstr.FromInt32(p.Port)
			}
			cp, ok := byPort[target.String()]
			switch {
			case !ok:
				t.Errorf("Service %s port %s targets %q, which container %s does not declare", svc.Name, p.Name, target.String(), c.Name)
			case cp != p.Port:
				t.Errorf("Service %s port %s = %d targets container port %d, want the same number", svc.Name, p.Name, p.Port, cp)
			}
			grpcServed = grpcServed || (cp == grpcPort && p.Name == "grpc")
		}
	}
	if !grpcServed {
		t.Errorf("no Service exposes fenced's gRPC port %d as a port named grpc", grpcPort)
	}
}

// checkPDBAndHPA: the PodDisruptionBudget covers exactly the Deployment's
// pods; the autoscaler scales the Deployment and keeps at least 2.
func checkPDBAndHPA(t *testing.T, r *rendered, d *appsv1.Deployment) {
	want := []string{"Deployment/" + d.Name}
	pdbs := all[*policyv1.PodDisruptionBudget](r)
	if len(pdbs) == 0 {
		t.Errorf("no PodDisruptionBudget")
	}
	for _, p := range pdbs {
		sel, err := metav1.LabelSelectorAsSelector(p.Spec.Selector)
		if err != nil {
			t.Errorf("PodDisruptionBudget %s selector: %v", p.Name, err)
			continue
		}
		if got := selected(r, sel); !slices.Equal(got, want) {
			t.Errorf("PodDisruptionBudget %s selects the pods of %q, want %q", p.Name, got, want)
		}
		if p.Spec.MinAvailable == nil && p.Spec.MaxUnavailable == nil {
			t.Errorf("PodDisruptionBudget %s sets neither minAvailable nor maxUnavailable", p.Name)
		}
	}
	hpas := all[*autoscalingv2.HorizontalPodAutoscaler](r)
	if len(hpas) != 1 {
		t.Fatalf("%d HorizontalPodAutoscalers, want 1", len(hpas))
	}
	h := hpas[0]
	if ref := h.Spec.ScaleTargetRef; ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != d.Name {
		t.Errorf("HorizontalPodAutoscaler %s scaleTargetRef = %+v, want apps/v1 Deployment %s", h.Name, ref, d.Name)
	}
	if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 2 || h.Spec.MaxReplicas < *h.Spec.MinReplicas {
		t.Errorf("HorizontalPodAutoscaler %s replicas %s..%d, want a minimum >= 2 and a maximum above it", h.Name, deref(h.Spec.MinReplicas), h.Spec.MaxReplicas)
	}
	if len(h.Spec.Metrics) == 0 {
		t.Errorf("HorizontalPodAutoscaler %s has no metrics", h.Name)
	}
}

// checkNetworkPolicy: a policy selects fenced's pods and lets clients reach
// the gRPC port.
func checkNetworkPolicy(t *testing.T, r *rendered, d *appsv1.Deployment) {
	pods := labels.Set(d.Spec.Template.Labels)
	for _, np := range all[*networkingv1.NetworkPolicy](r) {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(pods) {
			continue
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port != nil && (p.Port.IntValue() == grpcPort || p.Port.String() == "grpc") {
					return
				}
			}
		}
		t.Errorf("NetworkPolicy %s selects fenced's pods but admits no traffic to port %d", np.Name, grpcPort)
		return
	}
	t.Errorf("no NetworkPolicy selects fenced's pods")
}

// checkWorkloadsRestricted: every container of every workload meets the
// restricted Pod Security Standard and has requests and limits.
func checkWorkloadsRestricted(t *testing.T, r *rendered) {
	type workload struct {
		name string
		spec corev1.PodSpec
	}
	var ws []workload
	for _, d := range all[*appsv1.Deployment](r) {
		ws = append(ws, workload{"Deployment/" + d.Name, d.Spec.Template.Spec})
	}
	for _, s := range all[*appsv1.StatefulSet](r) {
		ws = append(ws, workload{"StatefulSet/" + s.Name, s.Spec.Template.Spec})
	}
	for _, w := range ws {
		psc := w.spec.SecurityContext
		if psc == nil {
			psc = &corev1.PodSecurityContext{}
		}
		if psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: pod seccompProfile %s, want RuntimeDefault", w.name, deref(psc.SeccompProfile))
		}
		if w.spec.HostNetwork || w.spec.HostPID || w.spec.HostIPC {
			t.Errorf("%s shares a host namespace", w.name)
		}
		for _, c := range append(w.spec.InitContainers, w.spec.Containers...) {
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s container %s has no securityContext", w.name, c.Name)
				continue
			}
			nonRoot := ptrTrue(sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && ptrTrue(psc.RunAsNonRoot))
			uid := sc.RunAsUser
			if uid == nil {
				uid = psc.RunAsUser
			}
			if !nonRoot || (uid != nil && *uid == 0) {
				t.Errorf("%s container %s may run as root (runAsNonRoot %s (pod %s), runAsUser %s)", w.name, c.Name, deref(sc.RunAsNonRoot), deref(psc.RunAsNonRoot), deref(uid))
			}
			if !ptrTrue(sc.ReadOnlyRootFilesystem) {
				t.Errorf("%s container %s readOnlyRootFilesystem = %s, want true", w.name, c.Name, deref(sc.ReadOnlyRootFilesystem))
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || ptrTrue(sc.Privileged) {
				t.Errorf("%s container %s allowPrivilegeEscalation = %s, privileged = %s, want false, false", w.name, c.Name, deref(sc.AllowPrivilegeEscalation), deref(sc.Privileged))
			}
			if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
				t.Errorf("%s container %s capabilities = %s, want drop [ALL], add none", w.name, c.Name, deref(sc.Capabilities))
			}
			for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				req, lim := c.Resources.Requests[res], c.Resources.Limits[res]
				if req.IsZero() || lim.IsZero() || req.Cmp(lim) > 0 {
					t.Errorf("%s container %s %s request %s limit %s, want both, request <= limit", w.name, c.Name, res, req.String(), lim.String())
				}
			}
		}
	}
}

// checkNamespace: a render meant to be applied as it is puts every object
// in the namespace it creates, which enforces the restricted Pod Security
// Standard.
func checkNamespace(t *testing.T, r *rendered) {
	nss := all[*corev1.Namespace](r)
	if len(nss) != 1 {
		t.Fatalf("%d Namespaces rendered, want 1", len(nss))
	}
	ns := nss[0]
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("Namespace %s labels %v, want pod-security.kubernetes.io/enforce=restricted", ns.Name, ns.Labels)
	}
	for _, o := range r.objects {
		m, ok := o.(metav1.Object)
		if !ok || o == any(ns) {
			continue
		}
		if m.GetNamespace() != ns.Name {
			t.Errorf("%T %s namespace %q, want %q", o, m.GetName(), m.GetNamespace(), ns.Name)
		}
	}
}

// TestBinaryRunsManifestConfig runs the fenced binary with the environment
// each overlay's Deployment gives it (its ConfigMap; the Redis URL left out,
// so it serves from its embedded Redis, and the addresses moved to
// loopback): it must start, and answer SERVING on the health services the
// probes ask for and NOT_FOUND on one that does not exist.
func TestBinaryRunsManifestConfig(t *testing.T) {
	flags := serveFlags(t)
	known := envFlags(flags)
	for dir, complete := range kustomizations(t) {
		t.Run(dir, func(t *testing.T) {
			r := render(t, dir)
			c := fencedContainer(t, one[*appsv1.Deployment](t, r, fencedName))
			var env []string
			for name, v := range containerEnv(t, r, c, complete) {
				f, ok := known[name]
				switch {
				case !ok: // the Go runtime's or OpenTelemetry's; checked in TestManifests
				case f.name == "redis-url":
				case f.name == "listen" || f.name == "metrics-listen":
					env = append(env, name+"=127.0.0.1:0")
				default:
					env = append(env, name+"="+v)
				}
			}
			addr := runFenced(t, env)
			for service, want := range map[string]string{
				readyService:      "SERVING",
				livenessService:   "SERVING",
				"no-such-service": "NotFound",
			} {
				if got := healthStatus(t, addr, service); !strings.Contains(got, want) {
					t.Errorf("fenced with %s's environment: Health.Check(%q) = %s, want %s", dir, service, got, want)
				}
			}
		})
	}
}

// TestDockerfileMatchesManifests: the image exposes the Deployment's
// container ports and runs as the user the Deployment asks for.
func TestDockerfileMatchesManifests(t *testing.T) {
	r := render(t, "base")
	c := fencedContainer(t, one[*appsv1.Deployment](t, r, fencedName))
	var ports []string
	for _, p := range c.Ports {
		ports = append(ports, strconv.Itoa(int(p.ContainerPort)))
	}
	slices.Sort(ports)
	var exposed []string
	for _, in := range readDockerfile(t) {
		if in.op == "EXPOSE" {
			exposed = append(exposed, strings.Fields(in.args)...)
		}
	}
	slices.Sort(exposed)
	if !slices.Equal(exposed, ports) {
		t.Errorf("Dockerfile EXPOSE %q, Deployment container ports %q: want the same", exposed, ports)
	}
}

// TestREADME: the README names every overlay.
func TestREADME(t *testing.T) {
	data, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for dir := range kustomizations(t) {
		if strings.HasPrefix(dir, monitoredDir+"/") {
			continue
		}
		if !strings.Contains(string(data), dir) {
			t.Errorf("README.md does not mention %s", dir)
		}
	}
}
