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
	"strings"

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
	files, err := image.Write(out, version, bins)
	for _, f := range files {
		fmt.Println(f)
	}
	return err
}
