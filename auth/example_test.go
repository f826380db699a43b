package auth_test

import (
	"fmt"

	"github.com/rdmago/te/auth"
)

// A handshake between two holders of the secret, as a transport runs it:
// each message is encoded into whatever frame the protocol sends.
func Example() {
	secret, _ := auth.New([]byte("a cluster secret of some length"))
	me := auth.Party{Name: "10.0.0.1:15001", Epoch: 7}
	target := auth.Party{Name: "10.0.0.2:15001", Epoch: 9}

	in := secret.Initiate("tcp", me, auth.Party{Name: target.Name})
	helloBytes := auth.AppendHello(nil, in.Hello()) // initiator → target

	hello, _, _ := auth.ParseHello(helloBytes)
	re, err := secret.Respond("tcp", target, hello)
	if err != nil {
		return // addressed to someone else: close
	}
	chBytes := auth.AppendChallenge(nil, re.Challenge()) // target → initiator

	ch, _, _ := auth.ParseChallenge(chBytes)
	answer, err := in.Finish(ch)
	fmt.Println("target proved the secret:", err == nil)
	ansBytes := auth.AppendAnswer(nil, answer) // initiator → target

	a, _, _ := auth.ParseAnswer(ansBytes)
	fmt.Println("initiator proved the secret:", re.Check(a) == nil)
	fmt.Println(secret)
	// Output:
	// target proved the secret: true
	// initiator proved the secret: true
	// auth.Secret(redacted)
}
