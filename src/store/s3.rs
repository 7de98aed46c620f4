//! The S3 blob store (aws-sdk-s3): path-style, checksums only when required, so it
//! works against MinIO, Garage and RustFS as well as AWS. It never relies on
//! conditional PUT: every key is new.

use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
    StalledStreamProtectionConfig,
};
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use bytes::Bytes;

use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};

use super::blob::{BlobError, BlobReader, BlobSink, BlobStore, READ_AHEAD};
use crate::config::S3Config;

/// Blobs up to this size go up in one PUT; larger ones as a multipart upload of parts
/// this size (S3's minimum part is 5 MiB), so a write buffers at most one part.
pub const PART_SIZE: usize = 5 * 1024 * 1024;

pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
    endpoint: String,
}

impl S3Store {
    /// GetObject; `None` when the key does not exist.
    async fn get_object(
        &self,
        key: &str,
    ) -> Result<Option<aws_sdk_s3::operation::get_object::GetObjectOutput>, BlobError> {
        let result = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await;
        match result {
            Ok(output) => Ok(Some(output)),
            Err(SdkError::ServiceError(e)) if e.err().is_no_such_key() => Ok(None),
            Err(e) => Err(classify("get object", e)),
        }
    }

    pub fn new(config: &S3Config) -> Self {
        let credentials = Credentials::new(
            &config.access_key_id,
            config.secret_access_key.expose(),
            None,
            None,
            "stategate-config",
        );
        let timeouts = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(Duration::from_secs(config.response_timeout_seconds.max(1)))
            .operation_attempt_timeout(Duration::from_secs(config.request_timeout_seconds.max(1)))
            .build();
        let sdk_config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(&config.endpoint)
            .region(Region::new(config.region.clone()))
            .credentials_provider(credentials)
            .force_path_style(true)
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
            .stalled_stream_protection(StalledStreamProtectionConfig::disabled())
            .timeout_config(timeouts)
            .retry_config(aws_sdk_s3::config::retry::RetryConfig::standard().with_max_attempts(2))
            .build();
        S3Store {
            client: aws_sdk_s3::Client::from_conf(sdk_config),
            bucket: config.bucket.clone(),
            prefix: config.prefix.clone(),
            endpoint: config.endpoint.clone(),
        }
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }
}

/// Maps SDK errors: transport problems and 5xx are retryable, the rest are not.
fn classify<E>(what: &str, err: SdkError<E, HttpResponse>) -> BlobError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match &err {
        SdkError::DispatchFailure(_) | SdkError::TimeoutError(_) => {
            BlobError::Unavailable(format!("{what}: cannot reach the S3 endpoint"))
        }
        SdkError::ResponseError(_) => {
            BlobError::Unavailable(format!("{what}: malformed response from the S3 endpoint"))
        }
        SdkError::ServiceError(_) => {
            let status = err.raw_response().map_or(0, |r| r.status().as_u16());
            let code = err.code().unwrap_or("unknown");
            if status >= 500 {
                BlobError::Unavailable(format!("{what}: S3 answered {status} {code}"))
            } else {
                BlobError::Failed(format!("{what}: S3 answered {status} {code}"))
            }
        }
        _ => BlobError::Failed(format!(
            "{what}: {}",
            aws_sdk_s3::error::DisplayErrorContext(&err)
        )),
    }
}

impl S3Store {
    /// The ETag of `bucket/key` (any bucket the credentials can read), `None` if absent.
    pub async fn head_etag(&self, bucket: &str, key: &str) -> Result<Option<String>, BlobError> {
        match self
            .client
            .head_object()
            .bucket(bucket)
            .key(key)
            .send()
            .await
        {
            Ok(out) => Ok(Some(out.e_tag().unwrap_or_default().to_string())),
            Err(SdkError::ServiceError(e)) if e.err().is_not_found() => Ok(None),
            Err(e) => Err(classify("head object", e)),
        }
    }
}

/// An S3 blob in the making: buffered up to one part; a single PUT if it never grows
/// past that, else a multipart upload that is aborted unless it completes, so no
/// half-written object is ever visible under the key.
struct S3Sink {
    client: aws_sdk_s3::Client,
    bucket: String,
    key: String,
    part: bytes::BytesMut,
    upload_id: Option<String>,
    parts: Vec<CompletedPart>,
}

impl S3Sink {
    async fn upload_part(&mut self) -> Result<(), BlobError> {
        if self.upload_id.is_none() {
            let out = self
                .client
                .create_multipart_upload()
                .bucket(&self.bucket)
                .key(&self.key)
                .content_type("application/octet-stream")
                .send()
                .await
                .map_err(|e| classify("create multipart upload", e))?;
            let id = out
                .upload_id()
                .ok_or_else(|| BlobError::Failed("create multipart upload: no upload id".into()))?;
            self.upload_id = Some(id.to_string());
        }
        let number = self.parts.len() as i32 + 1;
        let data = self.part.split().freeze();
        let out = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(self.upload_id.as_deref().expect("started"))
            .part_number(number)
            .body(ByteStream::from(data))
            .send()
            .await
            .map_err(|e| classify("upload part", e))?;
        self.parts.push(
            CompletedPart::builder()
                .part_number(number)
                .set_e_tag(out.e_tag().map(str::to_string))
                .build(),
        );
        self.part.reserve(PART_SIZE);
        Ok(())
    }

    async fn complete(&mut self) -> Result<(), BlobError> {
        let Some(upload_id) = self.upload_id.clone() else {
            let data = self.part.split().freeze();
            self.client
                .put_object()
                .bucket(&self.bucket)
                .key(&self.key)
                .content_type("application/octet-stream")
                .body(ByteStream::from(data))
                .send()
                .await
                .map_err(|e| classify("put object", e))?;
            return Ok(());
        };
        if !self.part.is_empty() {
            self.upload_part().await?;
        }
        self.client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(&self.key)
            .upload_id(&upload_id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(std::mem::take(&mut self.parts)))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| classify("complete multipart upload", e))?;
        self.upload_id = None;
        Ok(())
    }

    /// Best effort; an upload left behind is invisible and expires by bucket policy.
    async fn abort_upload(client: aws_sdk_s3::Client, bucket: String, key: String, id: String) {
        if let Err(e) = client
            .abort_multipart_upload()
            .bucket(&bucket)
            .key(&key)
            .upload_id(&id)
            .send()
            .await
        {
            let e = classify("abort multipart upload", e);
            tracing::warn!(key, error = %e, "could not abort a multipart upload");
        }
    }
}

#[async_trait]
impl BlobSink for S3Sink {
    async fn write(&mut self, data: Bytes) -> Result<(), BlobError> {
        let mut data = &data[..];
        while !data.is_empty() {
            let take = data.len().min(PART_SIZE - self.part.len());
            self.part.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.part.len() == PART_SIZE {
                self.upload_part().await?;
            }
        }
        Ok(())
    }

    async fn finish(mut self: Box<Self>) -> Result<(), BlobError> {
        self.complete().await
    }

    async fn abort(self: Box<Self>) {
        // Drop aborts.
    }
}

impl Drop for S3Sink {
    fn drop(&mut self) {
        if let Some(id) = self.upload_id.take() {
            let (client, bucket, key) =
                (self.client.clone(), self.bucket.clone(), self.key.clone());
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(S3Sink::abort_upload(client, bucket, key, id));
            }
        }
    }
}

#[async_trait]
impl BlobStore for S3Store {
    async fn create(&self, key: &str) -> Result<Box<dyn BlobSink>, BlobError> {
        Ok(Box::new(S3Sink {
            client: self.client.clone(),
            bucket: self.bucket.clone(),
            key: self.full_key(key),
            part: bytes::BytesMut::new(),
            upload_id: None,
            parts: Vec::new(),
        }))
    }

    async fn read(&self, key: &str) -> Result<Option<BlobReader>, BlobError> {
        let Some(mut output) = self.get_object(key).await? else {
            return Ok(None);
        };
        let len = output.content_length().unwrap_or(0).max(0) as u64;
        let (tx, chunks) = tokio::sync::mpsc::channel(READ_AHEAD);
        tokio::spawn(async move {
            loop {
                let piece = match output.body.try_next().await {
                    Ok(None) => return,
                    Ok(Some(piece)) => Ok(piece),
                    Err(_) => Err(BlobError::Unavailable(
                        "get object: body read interrupted".into(),
                    )),
                };
                let failed = piece.is_err();
                if tx.send(piece).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Some(BlobReader { len, chunks }))
    }

    async fn put(&self, key: &str, data: Bytes) -> Result<(), BlobError> {
        self.client
            .put_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .content_type("application/octet-stream")
            .body(ByteStream::from(data))
            .send()
            .await
            .map_err(|e| classify("put object", e))?;
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>, BlobError> {
        let Some(output) = self.get_object(key).await? else {
            return Ok(None);
        };
        let body = output
            .body
            .collect()
            .await
            .map_err(|_| BlobError::Unavailable("get object: body read interrupted".into()))?;
        Ok(Some(body.into_bytes()))
    }

    async fn delete(&self, key: &str) -> Result<(), BlobError> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await
            .map_err(|e| classify("delete object", e))?;
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, BlobError> {
        let mut keys = Vec::new();
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(self.full_key(prefix))
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| classify("list objects", e))?;
            for object in page.contents() {
                if let Some(key) = object.key().and_then(|k| k.strip_prefix(&self.prefix)) {
                    keys.push(key.to_string());
                }
            }
        }
        Ok(keys)
    }

    fn describe(&self) -> String {
        format!(
            "s3 bucket {:?} at {} (prefix {:?})",
            self.bucket, self.endpoint, self.prefix
        )
    }

    fn write_buffer_bytes(&self) -> u64 {
        // One part, collected before it goes up (or the whole blob, when smaller).
        PART_SIZE as u64
    }
}
