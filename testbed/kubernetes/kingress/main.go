// Command kingress is the test cluster's Knative networking layer (KIngress), and the one
// non-production hop of the tests: no Envoy-based layer can be built here.
//
// It watches networking.internal.knative.dev Ingresses of its class, routes each request by
// its Host header (and path and header matches) to a split's Service, chosen by percent,
// adding the split's and the path's appendHeaders (Knative-Serving-Revision and
// -Namespace, which the activator needs), and reports each Ingress Ready with this proxy as
// its public and private load balancer. Service names are resolved by the cluster's DNS.
// Standard library only, so it builds in seconds without a module download.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"strings"
	"sync"
	"time"
)

const (
	ingressAPI   = "/apis/networking.internal.knative.dev/v1alpha1"
	classKey     = "networking.knative.dev/ingress.class"
	classAltKey  = "networking.knative.dev/ingress-class"
	maxRouteLine = 1 << 20
)

// Ingress holds the parts of a Knative Ingress that routing and status need.
type Ingress struct {
	Metadata struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		Generation      int64             `json:"generation"`
		ResourceVersion string            `json:"resourceVersion"`
		Annotations     map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		Rules []struct {
			Hosts []string `json:"hosts"`
			HTTP  *struct {
				Paths []Path `json:"paths"`
			} `json:"http"`
		} `json:"rules"`
	} `json:"spec"`
	Status struct {
		ObservedGeneration int64 `json:"observedGeneration"`
		Conditions         []struct {
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"conditions"`
	} `json:"status"`
}

// Path is one HTTPIngressPath.
type Path struct {
	Path          string                            `json:"path"`
	RewriteHost   string                            `json:"rewriteHost"`
	Headers       map[string]struct{ Exact string } `json:"headers"`
	Splits        []Split                           `json:"splits"`
	AppendHeaders map[string]string                 `json:"appendHeaders"`
}

// Split is one IngressBackendSplit.
type Split struct {
	ServiceNamespace string            `json:"serviceNamespace"`
	ServiceName      string            `json:"serviceName"`
	ServicePort      json.RawMessage   `json:"servicePort"`
	Percent          int               `json:"percent"`
	AppendHeaders    map[string]string `json:"appendHeaders"`
}

type proxy struct {
	api     *http.Client
	server  string
	class   string
	lbHost  string
	mu      sync.RWMutex
	ingress map[string]Ingress // namespace/name -> Ingress
	hosts   map[string][]Path  // host -> paths, from every Ingress
	backend *http.Transport
}

func main() {
	server := flag.String("server", "", "API server URL")
	ca := flag.String("ca", "", "API server CA file")
	cert := flag.String("cert", "", "client certificate file")
	key := flag.String("key", "", "client key file")
	listen := flag.String("listen", "", "address to serve on")
	dns := flag.String("dns", "", "cluster DNS server (host:port)")
	class := flag.String("class", "", "ingress class to implement")
	lbHost := flag.String("lb-host", "", "cluster DNS name of this proxy's Service")
	flag.Parse()

	api, err := apiClient(*ca, *cert, *key)
	if err != nil {
		log.Fatal(err)
	}
	resolver := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, "udp", *dns)
	}}
	dialer := &net.Dialer{Timeout: 5 * time.Second, Resolver: resolver}
	p := &proxy{
		api: api, server: *server, class: *class, lbHost: *lbHost,
		ingress: map[string]Ingress{}, hosts: map[string][]Path{},
		backend: &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 32,
			IdleConnTimeout: 30 * time.Second},
	}
	go p.watchForever()
	srv := &http.Server{Addr: *listen, Handler: p, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("kingress: serving %s on %s", *class, *listen)
	log.Fatal(srv.ListenAndServe())
}

func apiClient(ca, cert, key string) (*http.Client, error) {
	pem, err := os.ReadFile(ca)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, err
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{pair}}}}, nil
}

// ServeHTTP routes one request: host, then path prefix and header matches, then a split.
func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path, ok := p.route(r)
	if !ok {
		http.Error(w, "kingress: no route for host "+r.Host, http.StatusNotFound)
		return
	}
	if path.RewriteHost != "" {
		r.Host = path.RewriteHost
		if path, ok = p.route(r); !ok {
			http.Error(w, "kingress: no route for rewritten host "+r.Host, http.StatusNotFound)
			return
		}
	}
	split := pick(path.Splits)
	target := fmt.Sprintf("%s.%s.svc.cluster.local:%s", split.ServiceName, split.ServiceNamespace,
		strings.Trim(string(split.ServicePort), `"`))
	rp := &httputil.ReverseProxy{
		Transport:     p.backend,
		FlushInterval: -1,
		Rewrite: func(out *httputil.ProxyRequest) {
			out.Out.URL.Scheme = "http"
			out.Out.URL.Host = target
			out.Out.Host = r.Host
			out.SetXForwarded()
			for k, v := range path.AppendHeaders {
				out.Out.Header.Set(k, v)
			}
			for k, v := range split.AppendHeaders {
				out.Out.Header.Set(k, v)
			}
		},
	}
	rp.ServeHTTP(w, r)
}

func (p *proxy) route(r *http.Request) (Path, bool) {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	for _, path := range p.hosts[host] {
		if !strings.HasPrefix(r.URL.Path, path.Path) {
			continue
		}
		matched := true
		for name, want := range path.Headers {
			if r.Header.Get(name) != want.Exact {
				matched = false
			}
		}
		if matched {
			return path, true
		}
	}
	return Path{}, false
}

func pick(splits []Split) Split {
	if len(splits) == 1 {
		return splits[0]
	}
	n := rand.IntN(100)
	for _, s := range splits {
		if n < s.Percent {
			return s
		}
		n -= s.Percent
	}
	return splits[len(splits)-1]
}

// watchForever lists and watches Ingresses, relisting after any error.
func (p *proxy) watchForever() {
	for {
		if err := p.listAndWatch(); err != nil {
			log.Printf("kingress: %v; relisting", err)
		}
		time.Sleep(time.Second)
	}
}

func (p *proxy) listAndWatch() error {
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []Ingress `json:"items"`
	}
	if err := p.get(ingressAPI+"/ingresses", &list); err != nil {
		return err
	}
	p.mu.Lock()
	p.ingress = map[string]Ingress{}
	p.mu.Unlock()
	for _, ing := range list.Items {
		p.apply("ADDED", ing)
	}
	url := fmt.Sprintf("%s%s/ingresses?watch=1&allowWatchBookmarks=true&resourceVersion=%s",
		p.server, ingressAPI, list.Metadata.ResourceVersion)
	resp, err := p.api.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("watch: %s", resp.Status)
	}
	decoder := json.NewDecoder(io.LimitReader(resp.Body, 1<<40))
	for {
		var event struct {
			Type   string          `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		if err := decoder.Decode(&event); err != nil {
			return fmt.Errorf("watch ended: %w", err)
		}
		if event.Type == "ERROR" {
			return fmt.Errorf("watch error: %s", event.Object)
		}
		if event.Type == "BOOKMARK" {
			continue
		}
		var ing Ingress
		if err := json.Unmarshal(event.Object, &ing); err != nil {
			return err
		}
		p.apply(event.Type, ing)
	}
}

func (p *proxy) mine(ing Ingress) bool {
	a := ing.Metadata.Annotations
	return a[classKey] == p.class || a[classAltKey] == p.class
}

// apply updates the routing table with one watch event, then marks the Ingress Ready.
func (p *proxy) apply(kind string, ing Ingress) {
	if !p.mine(ing) {
		return
	}
	id := ing.Metadata.Namespace + "/" + ing.Metadata.Name
	p.mu.Lock()
	if kind == "DELETED" {
		delete(p.ingress, id)
	} else {
		p.ingress[id] = ing
	}
	p.hosts = map[string][]Path{}
	for _, known := range p.ingress {
		for _, rule := range known.Spec.Rules {
			if rule.HTTP == nil {
				continue
			}
			for _, host := range rule.Hosts {
				p.hosts[host] = append(p.hosts[host], rule.HTTP.Paths...)
			}
		}
	}
	p.mu.Unlock()
	if kind != "DELETED" && !ready(ing) {
		if err := p.markReady(ing); err != nil {
			log.Printf("kingress: status of %s: %v", id, err)
		} else {
			log.Printf("kingress: %s ready (generation %d)", id, ing.Metadata.Generation)
		}
	}
}

func ready(ing Ingress) bool {
	if ing.Status.ObservedGeneration != ing.Metadata.Generation {
		return false
	}
	for _, c := range ing.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// markReady writes the status subresource: this proxy is the load balancer, routes are set.
func (p *proxy) markReady(ing Ingress) error {
	now := time.Now().UTC().Format(time.RFC3339)
	conditions := []map[string]string{}
	for _, t := range []string{"LoadBalancerReady", "NetworkConfigured", "Ready"} {
		conditions = append(conditions, map[string]string{
			"type": t, "status": "True", "lastTransitionTime": now})
	}
	lb := map[string]any{"ingress": []map[string]string{{"domainInternal": p.lbHost}}}
	patch := map[string]any{"status": map[string]any{
		"observedGeneration": ing.Metadata.Generation, "conditions": conditions,
		"publicLoadBalancer": lb, "privateLoadBalancer": lb,
	}}
	body, _ := json.Marshal(patch)
	url := fmt.Sprintf("%s%s/namespaces/%s/ingresses/%s/status", p.server, ingressAPI,
		ing.Metadata.Namespace, ing.Metadata.Name)
	req, _ := http.NewRequest(http.MethodPatch, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/merge-patch+json")
	resp, err := p.api.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		text, _ := io.ReadAll(io.LimitReader(resp.Body, maxRouteLine))
		return fmt.Errorf("%s: %s", resp.Status, text)
	}
	return nil
}

func (p *proxy) get(path string, into any) error {
	resp, err := p.api.Get(p.server + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(into)
}
