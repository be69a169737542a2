package dns

import (
	"testing"

	"github.com/miekg/dns"
)

// Any packet the server receives is untrusted: whatever it holds, the
// answer is built without panicking and packs into a valid message.
func FuzzAnswer(f *testing.F) {
	h := NewHandler(5, nil)
	h.SetIndex(testIndex())
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{"web.shop.svc.clusterset.local.", dns.TypeA}, {"_http._tcp.web.shop.svc.clusterset.local.", dns.TypeSRV},
		{"db.shop.svc.clusterset.local.", dns.TypeAAAA}, {"clusterset.local.", dns.TypeANY}, {"example.com.", dns.TypeA}} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.qtype)
		m.SetEdns0(4096, false)
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, packet []byte) {
		req := new(dns.Msg)
		if req.Unpack(packet) != nil {
			return
		}
		m := h.answer(req)
		m.Truncate(dns.MinMsgSize)
		if _, err := m.Pack(); err != nil {
			t.Fatalf("answer to %v does not pack: %v", req.Question, err)
		}
	})
}
