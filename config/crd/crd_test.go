package crd

import (
	"bytes"
	"testing"

	upstream "sigs.k8s.io/mcs-api/config/crd"
)

// The mcs-api CRDs are vendored by `make crds`, never edited: they must be
// byte for byte those of the pinned sigs.k8s.io/mcs-api module.
func TestMCSCRDsMatchUpstream(t *testing.T) {
	for file, want := range map[string][]byte{
		"bases/multicluster.x-k8s.io_serviceexports.yaml": upstream.ServiceExportCRD,
		"bases/multicluster.x-k8s.io_serviceimports.yaml": upstream.ServiceImportCRD,
	} {
		got, err := Files.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from sigs.k8s.io/mcs-api's: run `make crds`", file)
		}
	}
}
