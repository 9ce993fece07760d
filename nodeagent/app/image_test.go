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

// TestImageShipsEveryTool checks that the agent image installs the package
// of every binary each mode executes (nftables mode executes none), so
// that every --proxy-mode can start from the image deploy/ builds.
func TestImageShipsEveryTool(t *testing.T) {
	dockerfile, err := os.ReadFile("../../deploy/Dockerfile.nodeagent")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`apt-get install -y --no-install-recommends ([^&\\\n]+)`).FindSubmatch(dockerfile)
	if m == nil {
		t.Fatal("no apt-get install line in deploy/Dockerfile.nodeagent")
	}
	installed := strings.Fields(string(m[1]))
	for mode, tools := range map[string][]string{"iptables": iptables.Tools(), "ipvs": ipvs.Tools()} {
		for _, tool := range tools {
			i := slices.IndexFunc(toolPackages, func(p toolPackage) bool { return p.tool.MatchString(tool) })
			if i < 0 {
				t.Errorf("%s mode runs %s, which no package in toolPackages ships", mode, tool)
				continue
			}
			if pkg := toolPackages[i].pkg; !slices.Contains(installed, pkg) {
				t.Errorf("%s mode runs %s from package %s, which the image does not install (it installs %v)", mode, tool, pkg, installed)
			}
		}
	}
}
