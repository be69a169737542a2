package recordfmt

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	mcsv1beta1 "sigs.k8s.io/mcs-api/pkg/apis/v1beta1"

	"github.com/clustermap/clustermap/internal/registry"
)

// The packed format holds a cluster's endpoints of a service in a few
// instances instead of one per address and port: its service record
// carries as many as fit beside its other attributes, and chunk instances
// carry the rest, a few hundred addresses each. An address with all its
// ports is one entry; a chunk is its entries, binary, deflated, base64 in
// up to maxParts attributes.
const (
	// AttrEndpointFormat on a service record says how the cluster writes
	// its endpoints: PackedFormat, or per endpoint when absent.
	AttrEndpointFormat = "CLUSTERMAP_ENDPOINTS"
	PackedFormat       = "packed"
	// AttrPackedParts is the prefix of the attributes holding a chunk.
	AttrPackedParts = "CLUSTERMAP_EP_"
	chunkRecord     = "endpoints" // AttrRecord of a chunk instance
	maxParts        = 5
	partLength      = maxValueLength
	// maxUnpacked bounds what one chunk may inflate to. Bytes alone do not
	// bound what they decode to (one port referenced 262,000 times fits
	// in 400 characters), so the items are bounded too: no chunk holds
	// more entries than a writer packs into one instance (about 1,700
	// addresses at best) nor more distinct ports than it lets in, and an
	// address names each port once.
	maxUnpacked     = 256 << 10
	maxChunkEntries = 2048
	maxChunkPorts   = 1024
	maxChunkStrings = 3*maxChunkEntries + 6*maxChunkPorts
	packEncoding    = 1 // first byte of a chunk
)

var packedKeys = func() []string {
	keys := make([]string, maxParts)
	for i := range keys {
		keys[i] = AttrPackedParts + strconv.Itoa(i)
	}
	return keys
}()

// ChunkID names chunk n (n >= 1) of a cluster's packed endpoints; chunk 0
// is the service record. It ends in the cluster's tag, as every id of its.
func ChunkID(clusterSet, cluster string, n int) string {
	return "clustermap-ep-" + strconv.Itoa(n) + "-" + clusterTag(clusterSet, cluster)
}

// chunkIndex reads n back from a chunk id of the cluster; -1 when it is not one.
func chunkIndex(id, clusterSet, cluster string) int {
	var n int
	if _, err := fmt.Sscanf(id, "clustermap-ep-%d-", &n); err != nil || n < 1 || id != ChunkID(clusterSet, cluster, n) {
		return -1
	}
	return n
}

// entry is one address of an export with all its ports.
type entry struct {
	addr                        netip.Addr
	ready, serving, terminating bool
	hostname, node, zone        string
	ports                       []port
}

// port is what an endpoint record says of one port besides its address.
type port struct {
	name        string
	protocol    corev1.Protocol
	number      int32
	servicePort mcsv1beta1.ServicePort
	targetPort  string
}

func (e entry) key() string { return e.addr.String() }

// entriesOf groups endpoints by address (and what is said of it), in
// address order.
func entriesOf(eps []registry.Endpoint) ([]entry, error) {
	type id struct {
		addr                        netip.Addr
		ready, serving, terminating bool
		hostname, node, zone        string
	}
	byID := map[id]*entry{}
	var ids []id
	for _, ep := range eps {
		addr, err := netip.ParseAddr(ep.IP)
		if err != nil {
			return nil, fmt.Errorf("endpoint address %q: %w", ep.IP, err)
		}
		serving := ep.Serving || ep.Ready // ready implies serving
		k := id{addr, ep.Ready, serving, ep.Terminating, ep.Hostname, ep.NodeName, ep.Zone}
		e := byID[k]
		if e == nil {
			e = &entry{addr: addr, ready: ep.Ready, serving: serving, terminating: ep.Terminating, hostname: ep.Hostname, node: ep.NodeName, zone: ep.Zone}
			byID[k] = e
			ids = append(ids, k)
		}
		e.ports = append(e.ports, port{name: ep.PortName, protocol: ep.Protocol, number: ep.Port, servicePort: ep.ServicePort, targetPort: ep.TargetPort})
	}
	out := make([]entry, len(ids))
	for i, k := range ids {
		out[i] = *byID[k]
	}
	sortEntries(out)
	return out, nil
}

func sortEntries(es []entry) {
	sort.SliceStable(es, func(i, j int) bool { return es[i].addr.Less(es[j].addr) })
}

// endpoints renders entries back as endpoint records.
func endpointsOf(es []entry) []registry.Endpoint {
	n := 0
	for _, e := range es {
		n += len(e.ports)
	}
	out := make([]registry.Endpoint, 0, n)
	for _, e := range es {
		for _, p := range e.ports {
			out = append(out, registry.Endpoint{
				IP: e.addr.String(), Port: p.number, PortName: p.name, Protocol: p.protocol,
				Ready: e.ready, Serving: e.serving, Terminating: e.terminating,
				Hostname: e.hostname, NodeName: e.node, Zone: e.zone,
				ServicePort: p.servicePort, TargetPort: p.targetPort,
			})
		}
	}
	return out
}

// Entry flags.
const (
	flagReady = 1 << iota
	flagServing
	flagTerminating
	flagIPv6
	flagAppProtocol // on a port: an appProtocol follows
)

// packChunk renders entries as a chunk's payload: a string table (index 0
// is ""), a port table, then the entries, deflated and in base64.
func packChunk(es []entry) string {
	payload, _ := pack(es)
	return payload
}

// pack is packChunk, also saying how many ports its table holds.
func pack(es []entry) (string, int) {
	var strs []string
	strIdx := map[string]uint64{"": 0}
	str := func(s string) uint64 {
		i, ok := strIdx[s]
		if !ok {
			strs = append(strs, s)
			i = uint64(len(strs))
			strIdx[s] = i
		}
		return i
	}
	var ports, body []byte
	// Ports are compared by value, appProtocol included (a pointer).
	type portKey struct {
		port
		appProtocol string
	}
	portIdx := map[portKey]uint64{}
	nports := uint64(0)
	for _, e := range es {
		body = append(body, flags(e))
		body = append(body, e.addr.AsSlice()...)
		body = binary.AppendUvarint(body, str(e.hostname))
		body = binary.AppendUvarint(body, str(e.node))
		body = binary.AppendUvarint(body, str(e.zone))
		var refs []uint64
		for _, p := range e.ports {
			k := portKey{port: p}
			if ap := p.servicePort.AppProtocol; ap != nil {
				k.servicePort.AppProtocol, k.appProtocol = nil, "+"+*ap
			}
			i, ok := portIdx[k]
			if !ok {
				i, nports = nports, nports+1
				portIdx[k] = i
				var f byte
				if p.servicePort.AppProtocol != nil {
					f = flagAppProtocol
				}
				ports = append(ports, f)
				for _, s := range []string{p.name, string(p.protocol), p.servicePort.Name, string(p.servicePort.Protocol), p.targetPort} {
					ports = binary.AppendUvarint(ports, str(s))
				}
				ports = binary.AppendUvarint(ports, uint64(uint16(p.number)))
				ports = binary.AppendUvarint(ports, uint64(uint16(p.servicePort.Port)))
				if p.servicePort.AppProtocol != nil {
					ports = binary.AppendUvarint(ports, str(*p.servicePort.AppProtocol))
				}
			}
			if !slices.Contains(refs, i) { // readers refuse a port named twice
				refs = append(refs, i)
			}
		}
		body = binary.AppendUvarint(body, uint64(len(refs)))
		for _, i := range refs {
			body = binary.AppendUvarint(body, i)
		}
	}
	raw := []byte{packEncoding}
	raw = binary.AppendUvarint(raw, uint64(len(strs)))
	for _, s := range strs {
		raw = binary.AppendUvarint(raw, uint64(len(s)))
		raw = append(raw, s...)
	}
	raw = binary.AppendUvarint(raw, nports)
	raw = append(raw, ports...)
	raw = binary.AppendUvarint(raw, uint64(len(es)))
	raw = append(raw, body...)
	return deflate64(raw), int(nports)
}

func deflate64(raw []byte) string {
	var z bytes.Buffer
	w, _ := flate.NewWriter(&z, flate.BestCompression)
	w.Write(raw)
	w.Close()
	return base64.StdEncoding.EncodeToString(z.Bytes())
}

func flags(e entry) byte {
	var f byte
	if e.ready {
		f |= flagReady
	}
	if e.serving {
		f |= flagServing
	}
	if e.terminating {
		f |= flagTerminating
	}
	if e.addr.Is6() {
		f |= flagIPv6
	}
	return f
}

var errTruncated = errors.New("packed endpoints end too soon")

// unpackChunk reads a chunk's payload back. It is another cluster's
// record: every length is checked, what it inflates to is bounded, and so
// is every count of what it decodes to (see maxUnpacked). It reads
// entries until their ports would pass budget endpoint records, and says
// whether it stopped there (cut).
func unpackChunk(payload string, budget int) (es []entry, cut bool, err error) {
	z, err := base64.StdEncoding.DecodeString(payload)
	if err != nil {
		return nil, false, fmt.Errorf("packed endpoints are not base64: %w", err)
	}
	raw, err := io.ReadAll(io.LimitReader(flate.NewReader(bytes.NewReader(z)), maxUnpacked+1))
	if err != nil {
		return nil, false, fmt.Errorf("packed endpoints do not inflate: %w", err)
	}
	if len(raw) > maxUnpacked {
		return nil, false, fmt.Errorf("packed endpoints inflate past %d bytes", maxUnpacked)
	}
	r := &reader{b: raw}
	if v := r.byte(); v != packEncoding {
		return nil, false, fmt.Errorf("packed endpoints in encoding %d, not %d", v, packEncoding)
	}
	nstrs := r.most(maxChunkStrings, "strings")
	strs := make([]string, 1, nstrs+1)
	for ; nstrs > 0 && r.err == nil; nstrs-- {
		strs = append(strs, string(r.bytes(int(r.count()))))
	}
	str := func() string {
		i := r.uvarint()
		if i >= uint64(len(strs)) {
			r.fail(fmt.Errorf("string %d of %d", i, len(strs)))
			return ""
		}
		return strs[i]
	}
	nports := r.most(maxChunkPorts, "ports")
	ports := make([]port, 0, nports)
	for ; nports > 0 && r.err == nil; nports-- {
		f := r.byte()
		p := port{name: str(), protocol: corev1.Protocol(str())}
		p.servicePort.Name, p.servicePort.Protocol, p.targetPort = str(), corev1.Protocol(str()), str()
		p.number, p.servicePort.Port = int32(r.port()), int32(r.port())
		if f&flagAppProtocol != 0 {
			ap := str()
			p.servicePort.AppProtocol = &ap
		}
		ports = append(ports, p)
	}
	n := r.most(maxChunkEntries, "entries")
	es = make([]entry, 0, min(int(n), max(budget, 0)))
	// seen[i] is the last entry (counted from 1) that named port i: an
	// entry names each port once.
	seen := make([]uint16, len(ports))
	for k := uint16(1); n > 0 && r.err == nil; n, k = n-1, k+1 {
		f := r.byte()
		size := 4
		if f&flagIPv6 != 0 {
			size = 16
		}
		addr, _ := netip.AddrFromSlice(r.bytes(size))
		e := entry{addr: addr, ready: f&flagReady != 0, serving: f&flagServing != 0, terminating: f&flagTerminating != 0,
			hostname: str(), node: str(), zone: str()}
		m := r.most(uint64(len(ports)), "ports of an address")
		if r.err != nil {
			break
		}
		if int(m) > budget {
			return es, true, nil
		}
		budget -= int(m)
		if m > 0 {
			e.ports = make([]port, 0, m)
		}
		for ; m > 0 && r.err == nil; m-- {
			i := r.uvarint()
			if i >= uint64(len(ports)) {
				r.fail(fmt.Errorf("port %d of %d", i, len(ports)))
				break
			}
			if seen[i] == k {
				r.fail(fmt.Errorf("address %s names port %d twice", addr, i))
				break
			}
			seen[i] = k
			p := ports[i]
			if ap := p.servicePort.AppProtocol; ap != nil {
				v := *ap // each endpoint its own
				p.servicePort.AppProtocol = &v
			}
			e.ports = append(e.ports, p)
		}
		es = append(es, e)
	}
	if r.err != nil {
		return nil, false, r.err
	}
	if len(r.b) > 0 {
		return nil, false, fmt.Errorf("packed endpoints have %d bytes past their end", len(r.b))
	}
	return es, false, nil
}

// reader reads a chunk's bytes; the first failure sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = fmt.Errorf("packed endpoints: %w", err)
	}
	r.b = nil
}

func (r *reader) byte() byte {
	if len(r.b) < 1 {
		r.fail(errTruncated)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *reader) bytes(n int) []byte {
	if n < 0 || len(r.b) < n {
		r.fail(errTruncated)
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail(errTruncated)
		return 0
	}
	r.b = r.b[n:]
	return v
}

// count reads a number of items to follow; each takes a byte at least,
// so a count past the bytes left is a lie.
func (r *reader) count() uint64 {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail(fmt.Errorf("%d items in %d bytes", n, len(r.b)))
		return 0
	}
	return n
}

// most reads a count of at most limit items.
func (r *reader) most(limit uint64, what string) uint64 {
	n := r.count()
	if n > limit {
		r.fail(fmt.Errorf("%d %s, more than the %d a writer packs", n, what, limit))
		return 0
	}
	return n
}

func (r *reader) port() uint16 {
	v := r.uvarint()
	if v > 65535 {
		r.fail(fmt.Errorf("port %d", v))
	}
	return uint16(v)
}

// splitParts spreads a payload over attributes of at most partLength.
// ChunkAttrs are the attributes of a cluster's chunk holding payload.
func ChunkAttrs(clusterSet, cluster, payload string) Attrs {
	a := Attrs{AttrClusterID: cluster, AttrClusterSetID: clusterSet, AttrRecord: chunkRecord}
	splitParts(a, payload)
	return a
}

func splitParts(a Attrs, payload string) {
	for i := 0; len(payload) > 0; i++ {
		n := min(partLength, len(payload))
		a[packedKeys[i]] = payload[:n]
		payload = payload[n:]
	}
}

// joinParts reads a payload back; "" when the record holds none.
func joinParts(a Attrs) string {
	var s strings.Builder
	for _, k := range packedKeys {
		v, ok := a[k]
		if !ok {
			break
		}
		s.WriteString(v)
	}
	return s.String()
}

// room is how many payload characters fit beside attributes base within
// Cloud Map's limits per instance (characters and attributes): each part
// costs its key besides its value.
func room(base Attrs) int {
	used := registrationLength
	for k, v := range base {
		used += len(k) + len(v)
	}
	best := 0
	for k := 1; k <= min(maxParts, maxAttrs-len(base)-registrationAttrs); k++ {
		best = max(best, min(k*partLength, maxAttrsLength-used-k*len(packedKeys[0])))
	}
	return best
}

// planChunks puts entries in the service record (chunk 0) when all fit
// there, and otherwise spreads them over chunks 1.. so that each fits its room, keeping each entry in the chunk prev says it
// was in: a change rewrites the chunks it touches, not the others. New
// entries fill the first chunks with room. When churn has left the chunks
// twice as many as a fresh packing needs, the fresh packing is taken.
func planChunks(es []entry, prev map[string]int, room func(n int) int) (map[int][]entry, error) {
	fits := func(n int, es []entry) bool {
		if len(es) == 0 {
			return true
		}
		payload, ports := pack(es)
		return len(es) <= maxChunkEntries && ports <= maxChunkPorts && len(payload) <= room(n)
	}
	if fits(0, es) {
		// A small export is one instance. A larger one leaves the service
		// record without endpoints: its labels changing moves none.
		return map[int][]entry{0: es}, nil
	}
	chunks := map[int][]entry{}
	var pending []entry
	for _, e := range es {
		if n, ok := prev[e.key()]; ok && n > 0 {
			chunks[n] = append(chunks[n], e)
		} else {
			pending = append(pending, e)
		}
	}
	for n, c := range chunks {
		if fits(n, c) {
			continue // the common case, in one try
		}
		// Outgrown (an entry gained ports, the service record labels):
		// it keeps what fits.
		k := fitting(len(c), func(k int) bool { return fits(n, c[:k]) })
		pending = append(pending, c[k:]...)
		chunks[n] = c[:k]
	}
	sortEntries(pending)
	if err := fill(chunks, pending, fits, 0); err != nil {
		return nil, err
	}
	if len(chunks) >= 3 {
		// Packed afresh only if that takes at most half the chunks: the
		// packing stops as soon as it would take more.
		fresh := map[int][]entry{}
		if err := fill(fresh, es, fits, len(chunks)/2); err == nil {
			return fresh, nil
		}
	}
	return chunks, nil
}

var errTooMany = errors.New("more chunks than wanted")

// fill adds pending entries to the first chunks with room, opening chunks
// as needed; empty chunks are dropped. With most > 0, it gives up
// (errTooMany) rather than open chunk most+1.
func fill(chunks map[int][]entry, pending []entry, fits func(int, []entry) bool, most int) error {
	for n := 1; len(pending) > 0; n++ {
		if most > 0 && n > most {
			return errTooMany
		}
		if n > MaxInstances {
			return &LimitError{Reason: fmt.Sprintf("endpoint %s does not fit a Cloud Map instance alone (its ports and names exceed %d characters)", pending[0].addr, maxAttrsLength)}
		}
		c := chunks[n]
		with := func(k int) []entry {
			out := append(append(make([]entry, 0, len(c)+k), c...), pending[:k]...)
			sortEntries(out)
			return out
		}
		k := fitting(len(pending), func(k int) bool { return fits(n, with(k)) })
		if k > 0 {
			chunks[n] = with(k)
			pending = pending[k:]
		}
	}
	for n, c := range chunks {
		if len(c) == 0 {
			delete(chunks, n)
		} else {
			sortEntries(c)
		}
	}
	return nil
}

// fitting is the largest k <= n for which ok(k) holds, given ok(0) (a
// binary search: sizes grow with k, nearly always strictly).
func fitting(n int, ok func(int) bool) int {
	lo, hi := 0, n
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if ok(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}
