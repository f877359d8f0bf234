// Package deploy holds fenced's Kubernetes manifests (kustomize: base/ and
// overlays/) and the image's build (../Dockerfile) as data; it has no code.
// Its tests render every kustomization with kustomize's Go API, decode each
// object strictly into the Kubernetes API types, and check the manifests
// against the fenced binary they run: its flags, environment variables,
// ports, health services and static build. The monitoring component
// (components/monitoring: scrape configuration, alerts, Grafana dashboard)
// is checked against a running fenced: every PromQL expression it and
// ../docs/observability.md hold parses with Prometheus's parser and names
// only metrics, labels and label values a live scrape has.
//
// It is a module of its own so that fenced's module keeps no Kubernetes
// dependency: `make test-deploy` (cd deploy && go test ./...).
package deploy
