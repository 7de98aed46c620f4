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

use super::blob::{BlobError, BlobStore};
use crate::config::S3Config;

pub struct S3Store {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
    endpoint: String,
}

impl S3Store {
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

#[async_trait]
impl BlobStore for S3Store {
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
        let result = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(self.full_key(key))
            .send()
            .await;
        let output = match result {
            Ok(output) => output,
            Err(SdkError::ServiceError(e)) if e.err().is_no_such_key() => return Ok(None),
            Err(e) => return Err(classify("get object", e)),
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
}
