//go:build linux

package devenv

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/clustermap/clustermap/internal/cloudmaplocal"
)

// CloudMap is a Cloud Map emulator served from this process.
type CloudMap struct {
	*cloudmaplocal.Server
	// URL is the API endpoint; AdminURL serves /faults and /metrics.
	URL, AdminURL string
	servers       []*http.Server
}

// StartCloudMap serves an emulator on listen and admin ("127.0.0.1:0" picks
// free ports).
func StartCloudMap(opts cloudmaplocal.Options, listen, admin string) (*CloudMap, error) {
	srv, err := cloudmaplocal.New(opts)
	if err != nil {
		return nil, err
	}
	cm := &CloudMap{Server: srv}
	for _, l := range []struct {
		addr string
		h    http.Handler
		url  *string
	}{{listen, srv.Handler(), &cm.URL}, {admin, srv.AdminHandler(), &cm.AdminURL}} {
		ln, err := net.Listen("tcp", l.addr)
		if err != nil {
			cm.Close()
			return nil, fmt.Errorf("the Cloud Map emulator cannot listen on %s: %w", l.addr, err)
		}
		hs := &http.Server{Handler: l.h, ReadHeaderTimeout: 10 * time.Second}
		cm.servers = append(cm.servers, hs)
		*l.url = "http://" + ln.Addr().String()
		go func() { _ = hs.Serve(ln) }()
	}
	return cm, nil
}

// Close stops serving and saves the state (with a data directory).
func (c *CloudMap) Close() error {
	var errs []error
	for _, s := range c.servers {
		errs = append(errs, s.Close())
	}
	errs = append(errs, c.Server.Close())
	return errors.Join(errs...)
}
