// Package readme holds the test that compiles the README's library
// snippet, so the code a newcomer copies first always builds.
package readme
