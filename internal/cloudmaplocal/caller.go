package cloudmaplocal

import (
	"context"
	"net/http"
	"strings"
)

// caller is who makes a call and where: the account its access key belongs
// to and the Region its signature is scoped to.
type caller struct {
	account string
	region  string
}

type callerKey struct{}

func withCaller(ctx context.Context, c caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// callerFrom returns the caller of an API call.
func callerFrom(ctx context.Context) caller {
	c, _ := ctx.Value(callerKey{}).(caller)
	return c
}

// callerOf reads the access key and Region from the request's SigV4
// Authorization header (Credential=AKID/date/region/service/aws4_request);
// an unsigned request is the default account in the default Region.
// checkSignature decides separately whether the signature is valid.
func (s *Server) callerOf(r *http.Request) caller {
	c := caller{account: s.opts.Account, region: s.opts.Region}
	_, cred, ok := strings.Cut(r.Header.Get("Authorization"), "Credential=")
	if !ok {
		return c
	}
	cred, _, _ = strings.Cut(cred, ",")
	parts := strings.Split(cred, "/")
	if len(parts) != 5 {
		return c
	}
	if a, ok := s.opts.Accounts[parts[0]]; ok {
		c.account = a
	}
	if parts[2] != "" {
		c.region = parts[2]
	}
	return c
}
