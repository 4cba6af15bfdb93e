package snapshot

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// s3PartSize bounds the memory one upload of unknown length buffers: S3
// needs each part's length before it is sent.
const s3PartSize = 16 << 20

// S3Store keeps objects in a bucket of S3-compatible storage, under an
// optional key prefix. A PUT is atomic in S3, so readers never see a
// partly written object.
type S3Store struct {
	client *minio.Client
	bucket string
	// prefix is "" or ends in "/".
	prefix string
}

// S3Config locates a bucket.
type S3Config struct {
	// Endpoint is host:port; default s3.amazonaws.com.
	Endpoint string
	// Insecure talks plain HTTP (a local S3-compatible server).
	Insecure bool
	Region   string
	Bucket   string
	// Prefix of every key (no leading or trailing slash needed).
	Prefix string
	// AccessKey and SecretKey; empty takes AWS_ACCESS_KEY_ID and
	// AWS_SECRET_ACCESS_KEY.
	AccessKey, SecretKey string
}

// NewS3Store connects to cfg's bucket and checks that it exists.
func NewS3Store(ctx context.Context, cfg S3Config) (*S3Store, error) {
	if cfg.Bucket == "" {
		return nil, errors.New("s3: the bucket is required (s3://BUCKET[/PREFIX])")
	}
	creds := credentials.NewEnvAWS()
	if cfg.AccessKey != "" || cfg.SecretKey != "" {
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, "")
	}
	client, err := minio.New(cmp.Or(cfg.Endpoint, "s3.amazonaws.com"), &minio.Options{
		Creds: creds, Secure: !cfg.Insecure, Region: cfg.Region, BucketLookup: minio.BucketLookupPath,
	})
	if err != nil {
		return nil, fmt.Errorf("s3 %s: %w", cfg.Endpoint, err)
	}
	prefix := strings.Trim(cfg.Prefix, "/")
	if prefix != "" {
		if err := ValidateKey(prefix); err != nil {
			return nil, fmt.Errorf("s3 prefix: %w", err)
		}
		prefix += "/"
	}
	s := &S3Store{client: client, bucket: cfg.Bucket, prefix: prefix}
	exists, err := client.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("s3 bucket %s at %s: %w", cfg.Bucket, client.EndpointURL().Host, err)
	}
	if !exists {
		return nil, fmt.Errorf("s3 bucket %s at %s does not exist", cfg.Bucket, client.EndpointURL().Host)
	}
	return s, nil
}

// ParseS3Location reads s3://BUCKET[/PREFIX][?endpoint=HOST:PORT&region=R&insecure=true].
func ParseS3Location(location string) (S3Config, error) {
	u, err := url.Parse(location)
	if err != nil || u.Scheme != "s3" {
		return S3Config{}, fmt.Errorf("%q is not an s3://BUCKET[/PREFIX] location", location)
	}
	q := u.Query()
	cfg := S3Config{Bucket: u.Host, Prefix: strings.Trim(u.Path, "/"), Endpoint: q.Get("endpoint"), Region: q.Get("region")}
	if v := q.Get("insecure"); v != "" {
		if cfg.Insecure, err = strconv.ParseBool(v); err != nil {
			return S3Config{}, fmt.Errorf("%s: insecure=%q is not a boolean", location, v)
		}
	}
	for k := range q {
		if k != "endpoint" && k != "region" && k != "insecure" {
			return S3Config{}, fmt.Errorf("%s: unknown parameter %q (endpoint, region, insecure)", location, k)
		}
	}
	return cfg, nil
}

// Open opens snapshot storage: an s3:// location (ParseS3Location), else a
// local directory.
func Open(ctx context.Context, location string) (ObjectStore, error) {
	if strings.HasPrefix(location, "s3://") {
		cfg, err := ParseS3Location(location)
		if err != nil {
			return nil, err
		}
		return NewS3Store(ctx, cfg)
	}
	if strings.Contains(location, "://") {
		return nil, fmt.Errorf("snapshot storage %q: want a directory or s3://BUCKET[/PREFIX]", location)
	}
	return NewDirStore(location)
}

func (s *S3Store) String() string { return "s3://" + s.bucket + "/" + s.prefix }

func (s *S3Store) key(key string) (string, error) {
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	return s.prefix + key, nil
}

// Put stores the whole of r under key.
func (s *S3Store) Put(ctx context.Context, key string, r io.Reader) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	if _, err := s.client.PutObject(ctx, s.bucket, k, r, -1, minio.PutObjectOptions{PartSize: s3PartSize}); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// Get opens the object under key.
func (s *S3Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	k, err := s.key(key)
	if err != nil {
		return nil, err
	}
	obj, err := s.client.GetObject(ctx, s.bucket, k, minio.GetObjectOptions{})
	if err == nil {
		// GetObject is lazy: Stat makes the request, so a missing object
		// is reported here rather than at the first Read.
		_, err = obj.Stat()
	}
	if err != nil {
		if obj != nil {
			obj.Close()
		}
		if isS3NotFound(err) {
			return nil, fmt.Errorf("get %s: %w", key, ErrNotFound)
		}
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	return obj, nil
}

func isS3NotFound(err error) bool {
	code := minio.ToErrorResponse(err).Code
	return code == "NoSuchKey" || code == "NotFound"
}

// Delete removes the object under key; a missing one is not an error.
func (s *S3Store) Delete(ctx context.Context, key string) error {
	k, err := s.key(key)
	if err != nil {
		return err
	}
	if err := s.client.RemoveObject(ctx, s.bucket, k, minio.RemoveObjectOptions{}); err != nil && !isS3NotFound(err) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// List returns the objects whose keys start with prefix, sorted by key
// (S3 lists in key order).
func (s *S3Store) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	var out []ObjectInfo
	for obj := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list %s: %w", prefix, obj.Err)
		}
		out = append(out, ObjectInfo{Key: strings.TrimPrefix(obj.Key, s.prefix), Size: obj.Size, ModTime: obj.LastModified})
	}
	return out, nil
}
