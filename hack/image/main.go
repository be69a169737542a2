// Command image writes clustermap's image (make image): an OCI layout of
// the multi-platform index, which crane and skopeo read, and one
// docker-load tarball per platform.
//
//	go run ./hack/image -version V -out DIR linux/amd64=PATH linux/arm64=PATH
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/clustermap/clustermap/internal/image"
)

func main() {
	version := flag.String("version", "dev", "version label and tag")
	out := flag.String("out", "bin/image", "output directory")
	flag.Parse()
	if err := run(*version, *out, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(version, out string, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("no binaries: pass PLATFORM=PATH, such as linux/amd64=bin/linux-amd64/clustermap")
	}
	var bins []image.Binary
	for _, a := range args {
		plat, path, ok := strings.Cut(a, "=")
		if !ok {
			return fmt.Errorf("%q: want PLATFORM=PATH", a)
		}
		p, err := image.ParsePlatform(plat)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		bins = append(bins, image.Binary{Platform: p, Data: data})
	}
	idx, err := image.Index(version, bins)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(out); err != nil {
		return err
	}
	tag, err := name.NewTag(image.Repository + ":" + strings.ReplaceAll(version, "+", "_"))
	if err != nil {
		return err
	}
	// One entry, the multi-platform index, named by its tag: skopeo copy
	// oci:bin/image/oci:TAG and crane push bin/image/oci both read it.
	p, err := layout.Write(filepath.Join(out, "oci"), empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{image.RefName: tag.TagStr()})); err != nil {
		return err
	}
	for _, b := range bins {
		img, err := image.Image(version, b)
		if err != nil {
			return err
		}
		file := filepath.Join(out, "clustermap-"+strings.ReplaceAll(image.PlatformString(b.Platform), "/", "-")+".tar")
		if err := tarball.WriteToFile(file, tag, img); err != nil {
			return err
		}
		fmt.Println(file)
	}
	fmt.Println(filepath.Join(out, "oci"), "(OCI layout:", tag.String()+")")
	return nil
}
