package recordfmttest

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"net/netip"
	"sync"
)

// The packed chunk's wire constants, as a hostile writer needs them
// (recordfmt's TestHostileWriterSpeaksTheFormat holds them to the
// format's own).
const (
	PackEncoding = 1
	FlagReady    = 1
	FlagServing  = 2
)

// RawChunk is a chunk's payload as a hostile writer makes it: one port
// (http/TCP 8080), then entries, each its flag byte, IPv4 address, three
// empty strings and refs, the port indexes it names.
func RawChunk(entries int, addr func(i int) netip.Addr, refs func(i int) []uint64, ports int) string {
	raw := []byte{PackEncoding}
	raw = binary.AppendUvarint(raw, 2) // strings: "http", "TCP"
	for _, s := range []string{"http", "TCP"} {
		raw = binary.AppendUvarint(raw, uint64(len(s)))
		raw = append(raw, s...)
	}
	raw = binary.AppendUvarint(raw, uint64(ports))
	for p := range ports {
		raw = append(raw, 0)
		for _, s := range []uint64{1, 2, 1, 2, 0} { // name, protocol, service port name and protocol, target port
			raw = binary.AppendUvarint(raw, s)
		}
		raw = binary.AppendUvarint(raw, uint64(8080+p))
		raw = binary.AppendUvarint(raw, uint64(80+p))
	}
	raw = binary.AppendUvarint(raw, uint64(entries))
	for i := range entries {
		raw = append(raw, FlagReady|FlagServing)
		raw = append(raw, addr(i).AsSlice()...)
		raw = append(raw, 0, 0, 0)
		r := refs(i)
		raw = binary.AppendUvarint(raw, uint64(len(r)))
		for _, x := range r {
			raw = binary.AppendUvarint(raw, x)
		}
	}
	// deflate64's, with one compressor for all (a new one allocates
	// 600 KiB: 1,000 chunks took seconds).
	var z bytes.Buffer
	deflaterMu.Lock()
	defer deflaterMu.Unlock()
	if deflater == nil {
		deflater, _ = flate.NewWriter(&z, flate.BestCompression)
	}
	deflater.Reset(&z)
	deflater.Write(raw)
	deflater.Close()
	return base64.StdEncoding.EncodeToString(z.Bytes())
}

var (
	deflaterMu sync.Mutex
	deflater   *flate.Writer
)

// HostileChunks are two chunks a member can write in one instance each:
// bomb names one port 262,000 times (it decoded to as many endpoints),
// wide is 500 addresses of 100 distinct ports (50,000 endpoints, past the
// default cap).
func HostileChunks() (bomb, wide string) {
	return RawChunk(1, PodAddr, func(int) []uint64 { return make([]uint64, 262_000) }, 1),
		RawChunk(500, PodAddr, func(int) []uint64 {
			r := make([]uint64, 100)
			for i := range r {
				r[i] = uint64(i)
			}
			return r
		}, 100)
}

// PodAddr is the i-th pod's IPv4 address, 10.x.y.z.
func PodAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}
