package dataplane

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// A node kwok has not initialized is left alone; an initialized one gets
// the node namespace's addresses as InternalIPs, its others kept.
func TestNodeAddressesWaitForKwok(t *testing.T) {
	ips := []netip.Addr{netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("fd00:198:18:1::1")}
	n := &corev1.Node{Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}, {Type: corev1.NodeHostName, Address: "n1"}}}}
	if _, update := NodeAddresses(n, ips); update {
		t.Fatal("an uninitialized node would be written, racing kwok's first status")
	}
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	want, update := NodeAddresses(n, ips)
	if !update || !slices.Equal(want, []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.18.1.1"},
		{Type: corev1.NodeInternalIP, Address: "fd00:198:18:1::1"}, {Type: corev1.NodeHostName, Address: "n1"}}) {
		t.Fatalf("addresses %v (update %t)", want, update)
	}
	n.Status.Addresses = want
	if _, update := NodeAddresses(n, ips); update {
		t.Error("a node with its addresses would be written again")
	}
}
