#!/usr/bin/env bash
# Builds the pinned tools of hack/tools into ./bin. A tool is rebuilt only
# when its binary is missing or was built from another version: the version
# each binary was built from is kept in bin/.versions/<name>.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/bin"
mkdir -p "$bin/.versions"

# ONLY="name ..." builds just those tools (make release needs only its
# SBOM tool), and nothing else this script sets up.
only=${ONLY:-}

# build <module dir> <module whose version pins the tools> <name=package>...
build() {
	local dir=$1 mod=$2
	shift 2
	if [[ -n "$only" ]]; then
		local wanted=()
		for spec in "$@"; do
			[[ " $only " == *" ${spec%%=*} "* ]] && wanted+=("$spec")
		done
		[[ ${#wanted[@]} -gt 0 ]] || return 0
		set -- "${wanted[@]}"
	fi
	local ver
	ver=$(cd "$dir" && go list -m -f '{{.Version}}' "$mod")
	# A tool built from a main package of ours is rebuilt when that changes.
	[[ -z "${OWN:-}" ]] || ver="$ver+$(cat "$dir/$OWN" | sha256sum | cut -c1-12)"
	local todo=()
	for spec in "$@"; do
		local name=${spec%%=*}
		if [[ -x "$bin/$name" && "$(cat "$bin/.versions/$name" 2>/dev/null)" == "$ver" ]]; then
			echo "tools: $name $ver up to date"
		else
			todo+=("$spec")
		fi
	done
	[[ ${#todo[@]} -gt 0 ]] || return 0
	for spec in "${todo[@]}"; do
		local name=${spec%%=*} pkg=${spec#*=}
		echo "tools: building $name $ver"
		(cd "$dir" && go build -o "$bin/$name" "$pkg")
		echo "$ver" >"$bin/.versions/$name"
	done
}

tools="$root/hack/tools"
build "$tools" k8s.io/kubernetes \
	kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
	kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
	kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
	kube-proxy=k8s.io/kubernetes/cmd/kube-proxy \
	kubectl=k8s.io/kubernetes/cmd/kubectl
build "$tools" go.etcd.io/etcd/server/v3 etcd=go.etcd.io/etcd/server/v3
build "$tools" sigs.k8s.io/controller-tools controller-gen=sigs.k8s.io/controller-tools/cmd/controller-gen
build "$tools/kwok" sigs.k8s.io/kwok kwok=sigs.k8s.io/kwok/cmd/kwok kwokctl=sigs.k8s.io/kwok/cmd/kwokctl
build "$tools/kustomize" sigs.k8s.io/kustomize/kustomize/v5 kustomize=sigs.k8s.io/kustomize/kustomize/v5
OWN=main.go build "$tools/coredns" github.com/coredns/coredns coredns=github.com/clustermap/clustermap/hack/tools/coredns
build "$tools/lint" honnef.co/go/tools staticcheck=honnef.co/go/tools/cmd/staticcheck
build "$tools/vuln" golang.org/x/vuln govulncheck=golang.org/x/vuln/cmd/govulncheck
build "$tools/cosign" github.com/sigstore/cosign/v2 cosign=github.com/sigstore/cosign/v2/cmd/cosign
build "$tools/sbom" github.com/CycloneDX/cyclonedx-gomod cyclonedx-gomod=github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod
build "$tools/prometheus" github.com/prometheus/prometheus \
	promtool=github.com/prometheus/prometheus/cmd/promtool \
	promqlcheck=github.com/clustermap/clustermap/hack/tools/prometheus/promqlcheck
build "$tools/vuln" golang.org/x/vulndb indexdb=golang.org/x/vulndb/cmd/indexdb

[[ -z "$only" ]] || exit 0

# The Go vulnerability database govulncheck reads (-db file://bin/vulndb):
# vuln.go.dev is not reachable here, the module proxy is, and the pinned
# golang.org/x/vulndb module carries the same reports as OSV files.
vulndb=$(cd "$tools/vuln" && go list -m -f '{{.Version}} {{.Dir}}' golang.org/x/vulndb)
if [[ -f "$bin/vulndb/index/db.json" && "$(cat "$bin/.versions/vulndb" 2>/dev/null)" == "${vulndb%% *}" ]]; then
	echo "tools: vulndb ${vulndb%% *} up to date"
else
	echo "tools: indexing vulndb ${vulndb%% *}"
	rm -rf "$bin/vulndb"
	"$bin/indexdb" -vulns "${vulndb#* }/data/osv" -out "$bin/vulndb"
	echo "${vulndb%% *}" >"$bin/.versions/vulndb"
fi

# CRDs other projects publish, copied from their pinned modules into
# bin/crds/<name> for the tests.
# crds <name> <module@version> <dir in the module> <file>...
crds() {
	local name=$1 mod=$2 sub=$3
	shift 3
	if [[ -f "$bin/crds/$name/$1" && "$(cat "$bin/.versions/crds-$name" 2>/dev/null)" == "$mod" ]]; then
		echo "tools: $name CRDs ${mod#*@} up to date"
		return
	fi
	echo "tools: $name CRDs ${mod#*@}"
	local dir
	dir=$(cd "$tools/prometheus" && go mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	mkdir -p "$bin/crds/$name"
	for f in "$@"; do
		install -m 0644 "$dir/$sub/$f" "$bin/crds/$name/"
	done
	echo "$mod" >"$bin/.versions/crds-$name"
}
# The Prometheus Operator's ServiceMonitor and PrometheusRule: the chart
# tests install the chart's monitoring objects against the real schemas.
crds monitoring github.com/prometheus-operator/prometheus-operator@v0.85.0 example/prometheus-operator-crd \
	monitoring.coreos.com_prometheusrules.yaml monitoring.coreos.com_servicemonitors.yaml
# The AWS Cloud Map MCS controller's CRDs serve v1alpha1 only, as
# sigs.k8s.io/mcs-api v0.1.0's do: the migration test starts from them.
crds mcs-v1alpha1 sigs.k8s.io/mcs-api@v0.1.0 config/crd \
	multicluster.x-k8s.io_serviceexports.yaml multicluster.x-k8s.io_serviceimports.yaml

# The data plane (dev up --dataplane) runs kube-proxy in nftables mode, which
# needs nft. Its pods run the host's programs: what pods and exec sessions
# commonly need (sh, socat, nc with -4/-6, dig, nslookup, curl).
need=()
for p in nft:nftables dig:dnsutils nslookup:dnsutils curl:curl socat:socat nc:netcat-openbsd; do
	command -v "${p%%:*}" >/dev/null || need+=("${p#*:}")
done
# nc must be OpenBSD's (-4/-6, -u, -w, -q); another netcat may be installed.
if command -v nc >/dev/null && ! nc -h 2>&1 | grep -q -- '-4'; then need+=(netcat-openbsd); fi
if [[ ${#need[@]} -gt 0 ]]; then
	echo "tools: installing Debian packages ${need[*]}"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
