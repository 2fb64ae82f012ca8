// vcsim for vmpool's tests: govmomi's vCenter simulator (Debian's
// golang-github-vmware-govmomi-dev) serving one VPX inventory on loopback.
//
// Usage: vcsim [-listen 127.0.0.1:0]; the login is read from VCSIM_USERNAME and
// VCSIM_PASSWORD. Prints "URL https://host:port/sdk" once it serves, then runs until
// SIGTERM or SIGINT. Inventory: DC0 with a standalone host DC0_H0, a cluster DC0_C0 of
// two hosts, datastores LocalDS_0 and LocalDS_1, and two VMs per host and resource pool.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/vmware/govmomi/simulator"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "host:port to serve on (port 0: a free one)")
	flag.Parse()

	model := simulator.VPX()
	model.Datacenter = 1
	model.Host = 1
	model.Cluster = 1
	model.ClusterHost = 2
	model.Datastore = 2
	model.Machine = 2
	if err := model.Create(); err != nil {
		log.Fatalf("vcsim: model: %v", err)
	}
	defer model.Remove()

	login := url.UserPassword(os.Getenv("VCSIM_USERNAME"), os.Getenv("VCSIM_PASSWORD"))
	model.Service.Listen = &url.URL{Host: *listen, User: login}
	model.Service.TLS = new(tls.Config)
	server := model.Service.NewServer()
	defer server.Close()

	shown := *server.URL
	shown.User = nil
	fmt.Printf("URL %s\n", shown.String())
	os.Stdout.Sync()

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
