// cosign, for TestRelease: a key-based signature of the release's
// checksums and image, made and verified as a user verifies them (the
// release workflow signs keyless).
module github.com/clustermap/clustermap/hack/tools/cosign

go 1.24.0

tool github.com/sigstore/cosign/v2/cmd/cosign
