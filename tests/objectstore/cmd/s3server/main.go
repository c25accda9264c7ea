// s3server: the S3-compatible object store of the tests (tests/object_store.py starts it).
//
// gofakes3's s3afero backend keeps each object in a file under -root (buckets/<bucket>/<key>,
// and an MD5 and the user metadata under metadata/): a GET, ranged or not, reads from the file,
// a PUT streams into it, so the objects of a test are not held in this process's memory. (Its
// s3bolt backend keeps each object as one value in a bbolt file and decodes all of it for any
// GET, a ranged one too; s3mem keeps everything in memory.)
//
// s3afero does not page listings: gofakes3 then lists everything in one response (max-keys
// ignored, never truncated), and its CommonPrefixes for a prefix that does not end in the
// delimiter name directories that do not exist ("a/to" listed "a/to/topic-0/" for the key
// "a/topic-0/x"). ListBucket below does what S3 does instead, over the flat, sorted list of
// the keys under the prefix.
//
// A PUT that fails once it has begun writing (the client gone, a wrong Content-MD5) leaves
// s3afero's file in place without its metadata, and s3afero then fails every listing of the
// bucket ("open metadata/...: no such file"); PutObject below removes what it wrote. (S3 keeps
// the object a failed PUT would have replaced; here there is none.)
//
// gofakes3 keeps every x-amz-* header of a PUT with the object and sends it back with each GET,
// boto3's x-amz-checksum-crc32 of the whole object too: with a range of it (boto3 then rejects
// the part: "Expected checksum ... did not match"), and after a multipart upload replaced the
// object (a new object keeps the headers of the old one it does not set itself). It checks no
// checksum either; withoutChecksums drops them from the requests, so a GET has none to check.
//
// s3afero keeps the object "a/b" as the file a/b: storable refuses the keys that layout cannot
// hold (S3 takes them) instead of storing them under another name.
//
// Path-style requests only (http://127.0.0.1:PORT/<bucket>/<key>), as the tests' clients send.
package main

import (
	"flag"
	"fmt"
	"html"
	"io"
	"log"
	"net"
	"net/http"
	"sort"
	"strings"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3afero"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "address to listen on; port 0 lets the kernel choose (printed)")
	root := flag.String("root", "", "directory for the buckets and their metadata (created when missing)")
	flag.Parse()
	if *root == "" {
		log.Fatal("s3server: -root is required")
	}
	fs, err := s3afero.FsPath(*root, s3afero.FsPathCreateAll)
	if err != nil {
		log.Fatal(err)
	}
	backend, err := s3afero.MultiBucket(fs)
	if err != nil {
		log.Fatal(err)
	}
	faker := gofakes3.New(listing{backend},
		gofakes3.WithLogger(gofakes3.GlobalLog(gofakes3.LogErr, gofakes3.LogWarn)), // not a line a request
	)
	listener, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	// Bound, so connections queue from here on: the line a caller waits for (stdout is unbuffered).
	fmt.Printf("s3server listening on http://%s\n", listener.Addr())
	log.Fatal(http.Serve(listener, storable(withoutChecksums(faker.Server()))))
}

func withoutChecksums(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for name := range r.Header {
			if strings.HasPrefix(name, "X-Amz-Checksum-") {
				r.Header.Del(name)
			}
		}
		next.ServeHTTP(w, r)
	})
}

// storable answers a PUT or POST of an object whose key has an empty, "." or ".." part with
// 400 InvalidArgument. s3afero joins bucket and key into a path, which drops such parts: "d/"
// (a directory marker) was stored as the file d, with metadata under another name, and every
// later listing of the bucket failed; "a/../b" is b, "../other/k" is in the bucket other.
func storable(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if (r.Method == http.MethodPut || r.Method == http.MethodPost) && key != "" {
			for _, part := range strings.Split(key, "/") {
				if part == "" || part == "." || part == ".." {
					w.Header().Set("Content-Type", "application/xml")
					w.WriteHeader(http.StatusBadRequest)
					fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?>`+"\n"+
						`<Error><Code>InvalidArgument</Code><Message>the tests' object store (s3server) cannot `+
						`store a key with an empty, "." or ".." part</Message><Key>%s</Key></Error>`, html.EscapeString(key))
					return
				}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// listing is s3afero's backend with S3's listing: keys in UTF-8 binary order, the keys that
// have the delimiter after the prefix rolled up into one CommonPrefix, marker (or continuation
// token) and max-keys over keys and CommonPrefixes alike. A directory that deleting its
// objects left empty is no prefix either (s3afero does not remove directories).
type listing struct {
	*s3afero.MultiBucketBackend
}

func (b listing) ListBucket(bucket string, prefix *gofakes3.Prefix, page gofakes3.ListBucketPage) (*gofakes3.ObjectList, error) {
	var p gofakes3.Prefix
	if prefix != nil {
		p = *prefix
	}
	// Without a delimiter s3afero walks the bucket's files and keeps those under the prefix.
	all, err := b.MultiBucketBackend.ListBucket(bucket, &gofakes3.Prefix{HasPrefix: p.HasPrefix, Prefix: p.Prefix}, gofakes3.ListBucketPage{})
	if err != nil {
		return nil, err
	}
	sort.Slice(all.Contents, func(i, j int) bool { return all.Contents[i].Key < all.Contents[j].Key })

	out := gofakes3.NewObjectList()
	var count int64
	last := ""
	for _, c := range all.Contents {
		name, common := c.Key, false
		if p.HasDelimiter {
			if i := strings.Index(c.Key[len(p.Prefix):], p.Delimiter); i >= 0 {
				name, common = c.Key[:len(p.Prefix)+i+len(p.Delimiter)], true
			}
		}
		// A CommonPrefix sorts before its keys and after every key outside it: a marker at
		// one skips the whole group.
		if (page.HasMarker && name <= page.Marker) || (common && name == last) {
			continue
		}
		if page.MaxKeys > 0 && count == page.MaxKeys {
			out.IsTruncated, out.NextMarker = true, last
			break
		}
		if common {
			out.AddPrefix(name)
		} else {
			out.Add(c)
		}
		count, last = count+1, name
	}
	return out, nil
}

func (b listing) PutObject(bucket, key string, meta map[string]string, input io.Reader, size int64,
	conditions *gofakes3.PutConditions) (gofakes3.PutObjectResult, error) {
	body := &readCounter{r: input}
	result, err := b.MultiBucketBackend.PutObject(bucket, key, meta, body, size, conditions)
	if err != nil && body.reads > 0 { // not a refusal before writing: a missing bucket, a failed If-Match
		if _, derr := b.MultiBucketBackend.DeleteObject(bucket, key); derr != nil {
			log.Printf("s3server: removing the object a failed PUT began, %s/%s: %v", bucket, key, derr)
		}
	}
	return result, err
}

type readCounter struct {
	r     io.Reader
	reads int
}

func (c *readCounter) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}
