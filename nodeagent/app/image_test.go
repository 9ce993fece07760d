package app

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/proxyplane/proxyplane/nodeagent/dataplane/iptables"
	"github.com/proxyplane/proxyplane/nodeagent/dataplane/ipvs"
)

// toolPackage names the Debian package that ships a tool a dataplane
// executes.
type toolPackage struct {
	tool *regexp.Regexp
	pkg  string
}

// toolPackages are where the image gets each tool; a tool missing here
// fails the test until someone says.
var toolPackages = []toolPackage{
	{regexp.MustCompile(`^ip6?tables-(nft|legacy)(-restore|-save)?$`), "iptables"},
	{regexp.MustCompile(`^ipset$`), "ipset"},
}

// TestImageShipsEveryTool checks that both recipes of the agent image,
// deploy/Dockerfile.nodeagent (for operators with a registry) and `make
// images` (offline, the Makefile's IMAGE_AGENT_PACKAGES), install the
// package of every binary each mode executes (nftables mode executes
// none), so that every --proxy-mode can start from either image, and that
// they install the same packages, so that the tools operators use by hand
// are in both.
func TestImageShipsEveryTool(t *testing.T) {
	recipes := map[string][]string{
		"deploy/Dockerfile.nodeagent": packagesIn(t, "../../deploy/Dockerfile.nodeagent",
			`apt-get install -y --no-install-recommends ([^&\\\n]+)`),
		"the Makefile's IMAGE_AGENT_PACKAGES": packagesIn(t, "../../Makefile",
			`(?m)^IMAGE_AGENT_PACKAGES\s*:?=([^\n]+)$`),
	}
	for recipe, installed := range recipes {
		for mode, tools := range map[string][]string{"iptables": iptables.Tools(), "ipvs": ipvs.Tools()} {
			for _, tool := range tools {
				i := slices.IndexFunc(toolPackages, func(p toolPackage) bool { return p.tool.MatchString(tool) })
				if i < 0 {
					t.Errorf("%s mode runs %s, which no package in toolPackages ships", mode, tool)
					continue
				}
				if pkg := toolPackages[i].pkg; !slices.Contains(installed, pkg) {
					t.Errorf("%s mode runs %s from package %s, which %s does not install (it installs %v)", mode, tool, pkg, recipe, installed)
				}
			}
		}
	}
	docker, offline := recipes["deploy/Dockerfile.nodeagent"], recipes["the Makefile's IMAGE_AGENT_PACKAGES"]
	if !slices.Equal(docker, offline) {
		t.Errorf("the two recipes install different packages: deploy/Dockerfile.nodeagent %v, the Makefile's IMAGE_AGENT_PACKAGES %v", docker, offline)
	}
}

// packagesIn returns the packages the first match of pattern in file
// lists (its first group, separated by spaces), sorted.
func packagesIn(t *testing.T, file, pattern string) []string {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(pattern).FindSubmatch(b)
	if m == nil {
		t.Fatalf("no package list in %s (looked for %s)", file, pattern)
	}
	return slices.Sorted(slices.Values(strings.Fields(string(m[1]))))
}
