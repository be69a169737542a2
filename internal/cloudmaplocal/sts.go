package cloudmaplocal

import (
	"bytes"
	"encoding/xml"
	"net/http"
	"net/url"
)

// STS GetCallerIdentity, the one call of another AWS service the emulator
// answers: a controller asks it which account it runs as. It speaks the
// AWS query protocol (a form POST, an XML answer) on the same listener.

func isSTS(r *http.Request, body []byte) bool {
	return r.Header.Get("X-Amz-Target") == "" && bytes.Contains(body, []byte("Action=GetCallerIdentity"))
}

type callerIdentity struct {
	XMLName xml.Name `xml:"https://sts.amazonaws.com/doc/2011-06-15/ GetCallerIdentityResponse"`
	Result  struct {
		Arn     string `xml:"Arn"`
		UserID  string `xml:"UserId"`
		Account string `xml:"Account"`
	} `xml:"GetCallerIdentityResult"`
	RequestID string `xml:"ResponseMetadata>RequestId"`
}

func (s *Server) serveSTS(w http.ResponseWriter, r *http.Request, body []byte, who caller) {
	form, err := url.ParseQuery(string(body))
	if err != nil || form.Get("Action") != "GetCallerIdentity" {
		http.Error(w, "only GetCallerIdentity is served", http.StatusBadRequest)
		return
	}
	var out callerIdentity
	out.Result.Account = who.account
	out.Result.Arn = "arn:aws:iam::" + who.account + ":root"
	out.Result.UserID = who.account
	out.RequestID = randomRequestID()
	w.Header().Set("Content-Type", "text/xml")
	_ = xml.NewEncoder(w).Encode(out)
}
