// Package image builds clustermap's OCI image without a Docker daemon or a
// base image: one layer holding the static binary and the passwd/group
// entries of its non-root user, a config saying how to run it, one image
// per platform under one index.
package image

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing/fstest"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Repository is where releases are published; the chart and kustomize
// configs pull from it.
const Repository = "ghcr.io/clustermap/clustermap"

// UID and GID the binary runs as: the conventional "nonroot" of distroless
// images, so PodSecurity's restricted profile and read-only root
// filesystems need nothing more.
const UID = 65532

// Labels every image carries (OCI annotation keys).
const (
	LabelVersion  = "org.opencontainers.image.version"
	LabelSource   = "org.opencontainers.image.source"
	LabelLicenses = "org.opencontainers.image.licenses"
	LabelTitle    = "org.opencontainers.image.title"
	// RefName names an entry of an OCI layout's index.json.
	RefName = "org.opencontainers.image.ref.name"
)

// Binary is clustermap built for one platform ("linux/amd64").
type Binary struct {
	Platform v1.Platform
	Data     []byte
}

// epoch is every file's and the image's creation time: the same sources
// give the same digests.
var epoch = time.Unix(0, 0).UTC()

// Image builds one platform's image.
func Image(version string, b Binary) (v1.Image, error) {
	files := fstest.MapFS{
		"clustermap": {Data: b.Data, Mode: 0o755, ModTime: epoch},
		"etc":        {Mode: fs.ModeDir | 0o755, ModTime: epoch},
		"etc/passwd": {Data: fmt.Appendf(nil, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", UID, UID), Mode: 0o644, ModTime: epoch},
		"etc/group":  {Data: fmt.Appendf(nil, "root:x:0:\nnonroot:x:%d:\n", UID), Mode: 0o644, ModTime: epoch},
		"tmp":        {Mode: fs.ModeDir | fs.ModeSticky | 0o777, ModTime: epoch},
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.AddFS(files); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = b.Platform.OS, b.Platform.Architecture, b.Platform.Variant
	cf.Created = v1.Time{Time: epoch}
	cf.Config = v1.Config{
		Entrypoint: []string{"/clustermap"},
		Cmd:        []string{"controller"},
		User:       fmt.Sprintf("%d:%d", UID, UID),
		WorkingDir: "/",
		Env:        []string{"HOME=/home/nonroot"},
		Labels: map[string]string{
			LabelVersion:  version,
			LabelSource:   "https://github.com/clustermap/clustermap",
			LabelLicenses: "Apache-2.0",
			LabelTitle:    "clustermap",
		},
	}
	return mutate.ConfigFile(img, cf)
}

// Index builds every platform's image under one OCI index.
func Index(version string, bins []Binary) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, b := range bins {
		img, err := Image(version, b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", PlatformString(b.Platform), err)
		}
		p := b.Platform
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &p}})
	}
	return idx, nil
}

// ParsePlatform reads "os/arch[/variant]".
func ParsePlatform(s string) (v1.Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return v1.Platform{}, fmt.Errorf("platform %q: want os/arch[/variant], such as linux/arm64", s)
	}
	p := v1.Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, nil
}

// PlatformString is "os/arch[/variant]".
func PlatformString(p v1.Platform) string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// Write writes, into dir (emptied first), the OCI layout of the index
// (dir/oci: one entry, named by its tag) and one docker-load tarball per
// platform (dir/clustermap-linux-<arch>.tar); it returns what it wrote.
func Write(dir, version string, bins []Binary) ([]string, error) {
	idx, err := Index(version, bins)
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	tag, err := Tag(version)
	if err != nil {
		return nil, err
	}
	// skopeo copy oci:DIR/oci:TAG and crane push DIR/oci both read it.
	p, err := layout.Write(filepath.Join(dir, "oci"), empty.Index)
	if err != nil {
		return nil, err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{RefName: tag.TagStr()})); err != nil {
		return nil, err
	}
	files := []string{filepath.Join(dir, "oci")}
	for _, b := range bins {
		img, err := Image(version, b)
		if err != nil {
			return nil, err
		}
		file := filepath.Join(dir, "clustermap-"+strings.ReplaceAll(PlatformString(b.Platform), "/", "-")+".tar")
		if err := tarball.WriteToFile(file, tag, img); err != nil {
			return nil, err
		}
		files = append(files, file)
	}
	return files, nil
}

// Tag is the image's reference for a version (a semver build suffix's +,
// which tags cannot hold, becomes _).
func Tag(version string) (name.Tag, error) {
	return name.NewTag(Repository + ":" + strings.ReplaceAll(version, "+", "_"))
}
