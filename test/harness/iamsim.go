package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/iam"
)

// IAMSimulator starts an endpoint in front of moto that serves iam:SimulatePrincipalPolicy,
// which moto lacks, and forwards every other request to moto: point a whole AWS config at its
// URL. It decides each action from the role's policies as moto holds them (the attached
// managed policies' default versions and the inline policies): an explicit Deny of the action
// is explicitDeny, else an Allow is allowed, else implicitDeny, as IAM's simulator answers for
// identity policies alone. Conditions, resources and NotAction are not evaluated: the callers
// simulate plain Allow and Deny statements. cfg reaches moto directly.
func IAMSimulator(t testing.TB, motoURL string, cfg aws.Config) string {
	t.Helper()
	target, err := url.Parse(motoURL)
	if err != nil {
		t.Fatal(err)
	}
	s := &iamSimulator{
		iam:   iam.NewFromConfig(cfg, func(o *iam.Options) { o.BaseEndpoint = aws.String(motoURL) }),
		proxy: httputil.NewSingleHostReverseProxy(target),
	}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv.URL
}

type iamSimulator struct {
	iam   *iam.Client
	proxy *httputil.ReverseProxy
}

func (s *iamSimulator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		if form, err := url.ParseQuery(string(body)); err == nil && form.Get("Action") == "SimulatePrincipalPolicy" {
			s.simulate(w, r.Context(), form)
			return
		}
	}
	s.proxy.ServeHTTP(w, r)
}

// simulate answers SimulatePrincipalPolicy in IAM's Query protocol (XML).
func (s *iamSimulator) simulate(w http.ResponseWriter, ctx context.Context, form url.Values) {
	arn := form.Get("PolicySourceArn")
	role := arn[strings.LastIndex(arn, "/")+1:]
	docs, err := s.rolePolicies(ctx, role)
	if err != nil {
		w.Header().Set("Content-Type", "text/xml")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `<ErrorResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><Error><Type>Sender</Type><Code>NoSuchEntity</Code><Message>%s</Message></Error><RequestId>sim</RequestId></ErrorResponse>`, xmlEscape(err.Error()))
		return
	}
	var results strings.Builder
	for i := 1; form.Get(fmt.Sprintf("ActionNames.member.%d", i)) != ""; i++ {
		action := form.Get(fmt.Sprintf("ActionNames.member.%d", i))
		fmt.Fprintf(&results, `<member><EvalActionName>%s</EvalActionName><EvalResourceName>*</EvalResourceName><EvalDecision>%s</EvalDecision></member>`, xmlEscape(action), decide(docs, action))
	}
	w.Header().Set("Content-Type", "text/xml")
	fmt.Fprintf(w, `<SimulatePrincipalPolicyResponse xmlns="https://iam.amazonaws.com/doc/2010-05-08/"><SimulatePrincipalPolicyResult><IsTruncated>false</IsTruncated><EvaluationResults>%s</EvaluationResults></SimulatePrincipalPolicyResult><ResponseMetadata><RequestId>sim</RequestId></ResponseMetadata></SimulatePrincipalPolicyResponse>`, results.String())
}

// rolePolicies reads every identity policy document of role back from moto.
func (s *iamSimulator) rolePolicies(ctx context.Context, role string) ([]string, error) {
	var docs []string
	attached, err := s.iam.ListAttachedRolePolicies(ctx, &iam.ListAttachedRolePoliciesInput{RoleName: aws.String(role)})
	if err != nil {
		return nil, fmt.Errorf("listing the attached policies of %s: %w", role, err)
	}
	for _, p := range attached.AttachedPolicies {
		pol, err := s.iam.GetPolicy(ctx, &iam.GetPolicyInput{PolicyArn: p.PolicyArn})
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", aws.ToString(p.PolicyArn), err)
		}
		v, err := s.iam.GetPolicyVersion(ctx, &iam.GetPolicyVersionInput{PolicyArn: p.PolicyArn, VersionId: pol.Policy.DefaultVersionId})
		if err != nil {
			return nil, fmt.Errorf("policy %s: %w", aws.ToString(p.PolicyArn), err)
		}
		docs = append(docs, aws.ToString(v.PolicyVersion.Document))
	}
	inline, err := s.iam.ListRolePolicies(ctx, &iam.ListRolePoliciesInput{RoleName: aws.String(role)})
	if err != nil {
		return nil, fmt.Errorf("listing the inline policies of %s: %w", role, err)
	}
	for _, name := range inline.PolicyNames {
		p, err := s.iam.GetRolePolicy(ctx, &iam.GetRolePolicyInput{RoleName: aws.String(role), PolicyName: aws.String(name)})
		if err != nil {
			return nil, fmt.Errorf("inline policy %s of %s: %w", name, role, err)
		}
		docs = append(docs, aws.ToString(p.PolicyDocument))
	}
	return docs, nil
}

// decide is IAM's evaluation of identity policies for one action: an explicit Deny wins,
// then an Allow, else the implicit deny.
func decide(docs []string, action string) string {
	allowed := false
	for _, d := range docs {
		if un, err := url.QueryUnescape(d); err == nil && !json.Valid([]byte(d)) {
			d = un // IAM returns documents URL-encoded
		}
		var doc struct {
			Statement json.RawMessage
		}
		if json.Unmarshal([]byte(d), &doc) != nil {
			continue
		}
		var stmts []statement
		if json.Unmarshal(doc.Statement, &stmts) != nil {
			var one statement
			if json.Unmarshal(doc.Statement, &one) != nil {
				continue
			}
			stmts = []statement{one}
		}
		for _, st := range stmts {
			if !st.matches(action) {
				continue
			}
			if st.Effect == "Deny" {
				return "explicitDeny"
			}
			allowed = allowed || st.Effect == "Allow"
		}
	}
	if allowed {
		return "allowed"
	}
	return "implicitDeny"
}

type statement struct {
	Effect string
	Action json.RawMessage
}

func (st statement) matches(action string) bool {
	var actions []string
	if json.Unmarshal(st.Action, &actions) != nil {
		var one string
		if json.Unmarshal(st.Action, &one) != nil {
			return false
		}
		actions = []string{one}
	}
	for _, a := range actions {
		if wildcard(strings.ToLower(a), strings.ToLower(action)) {
			return true
		}
	}
	return false
}

// wildcard matches IAM's action patterns: * for any run of characters, ? for one.
func wildcard(pattern, s string) bool {
	if pattern == "" {
		return s == ""
	}
	switch pattern[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if wildcard(pattern[1:], s[i:]) {
				return true
			}
		}
		return false
	case '?':
		return s != "" && wildcard(pattern[1:], s[1:])
	}
	return s != "" && s[0] == pattern[0] && wildcard(pattern[1:], s[1:])
}

func xmlEscape(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
