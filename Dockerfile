# For those who build with Docker; `make image` builds the same image
# without a daemon. docker buildx build --platform linux/amd64,linux/arm64 .
FROM golang:1.26.11 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux TARGETARCH=amd64 VERSION=dev
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
    -ldflags "-s -w -X github.com/clustermap/clustermap/internal/version.Version=$VERSION" \
    -o /out/clustermap ./cmd/clustermap

FROM scratch
ARG VERSION=dev
LABEL org.opencontainers.image.title=clustermap \
      org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.source=https://github.com/clustermap/clustermap \
      org.opencontainers.image.licenses=Apache-2.0
COPY --from=build /out/clustermap /clustermap
COPY --chmod=0644 <<PASSWD /etc/passwd
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
PASSWD
USER 65532:65532
ENV HOME=/home/nonroot
ENTRYPOINT ["/clustermap"]
CMD ["controller"]
