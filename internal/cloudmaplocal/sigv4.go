package cloudmaplocal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// checkSignature verifies a SigV4 signature when credentials are configured:
// it signs a copy of the request, holding only the headers the client
// signed, with the client's date and the secret of its access key, and
// compares the two signatures.
func (s *Server) checkSignature(r *http.Request, body []byte) *apiError {
	if len(s.opts.Credentials) == 0 {
		return nil
	}
	auth := r.Header.Get("Authorization")
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 ") {
		return &apiError{Code: "MissingAuthenticationTokenException", Message: "Missing Authentication Token"}
	}
	fields := map[string]string{}
	for _, part := range strings.Split(strings.TrimPrefix(auth, "AWS4-HMAC-SHA256 "), ",") {
		if k, v, ok := strings.Cut(strings.TrimSpace(part), "="); ok {
			fields[k] = v
		}
	}
	cred := strings.Split(fields["Credential"], "/") // AKID/date/region/service/aws4_request
	if len(cred) != 5 {
		return invalidSignature("malformed Credential")
	}
	secret, ok := s.opts.Credentials[cred[0]]
	if !ok {
		return &apiError{Code: "UnrecognizedClientException", Message: "The security token included in the request is invalid."}
	}
	date, err := time.Parse("20060102T150405Z", r.Header.Get("X-Amz-Date"))
	if err != nil {
		return invalidSignature("missing or malformed X-Amz-Date")
	}
	if d := time.Since(date); d > 5*time.Minute || d < -5*time.Minute {
		return invalidSignature("Signature expired: the request time is too far from the server time")
	}
	again, err := http.NewRequestWithContext(context.Background(), r.Method, "http://"+r.Host+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return invalidSignature(err.Error())
	}
	again.Host = r.Host
	for _, h := range strings.Split(fields["SignedHeaders"], ";") {
		if h != "host" {
			again.Header[http.CanonicalHeaderKey(h)] = r.Header.Values(h)
		}
	}
	sum := sha256.Sum256(body)
	creds := aws.Credentials{AccessKeyID: cred[0], SecretAccessKey: secret, SessionToken: r.Header.Get("X-Amz-Security-Token")}
	if err := v4.NewSigner().SignHTTP(context.Background(), creds, again, hex.EncodeToString(sum[:]), cred[3], cred[2], date); err != nil {
		return invalidSignature(err.Error())
	}
	want := again.Header.Get("Authorization")
	if subtle.ConstantTimeCompare([]byte(want), []byte(auth)) != 1 {
		return invalidSignature("The request signature we calculated does not match the signature you provided.")
	}
	return nil
}

func invalidSignature(msg string) *apiError {
	return &apiError{Code: "InvalidSignatureException", Message: msg}
}
