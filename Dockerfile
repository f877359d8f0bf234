# syntax=docker/dockerfile:1
# fenced's image: a static binary (CGO off) on distroless, run as non-root.
#   docker build -t fenced .
#   docker run --rm -p 7420:7420 -e FENCED_REDIS_URL=redis://host:6379 fenced
# deploy/ tests the same build (CGO_ENABLED=0, -trimpath, -ldflags "-s -w")
# for a statically linked result; no Docker engine runs in CI.

# The builder runs on the build machine's platform and cross-compiles for
# the target's (docker buildx build --platform linux/amd64,linux/arm64 .).
FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /out/fenced ./cmd/fenced

# No shell, no package manager; the nonroot user is 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/fenced /fenced
USER 65532:65532
# gRPC, metrics.
EXPOSE 7420 7421 7422
ENTRYPOINT ["/fenced", "serve"]
