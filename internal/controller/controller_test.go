package controller

import "testing"

func TestNamespaceFilter(t *testing.T) {
	all := namespaceFilter(nil, DefaultExcludeNamespaces)
	only := namespaceFilter([]string{"a", "kube-system"}, DefaultExcludeNamespaces)
	for ns, want := range map[string][2]bool{
		"default": {true, false}, "a": {true, true}, "kube-system": {false, false}, "": {true, true},
	} {
		if all(ns) != want[0] || only(ns) != want[1] {
			t.Errorf("%q: all %v only %v, want %v", ns, all(ns), only(ns), want)
		}
	}
}
