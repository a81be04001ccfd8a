"""Django settings: everything from the environment, with embedded defaults.

With no variable set, Stencil runs on a bare machine: SQLite under ``var/`` and Celery's
filesystem transport (web and worker are still separate processes). Set ``DATABASE_URL``
(postgres://...) and ``CELERY_BROKER_URL`` (amqp://... or redis://...) for the real services.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

from stencil.env import database_from_url, envbool, envfloat, envint, envlist

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.getenv("STENCIL_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)  # the embedded defaults (SQLite, broker) live here

DEBUG = envbool("DEBUG", "False")  # development mode only when asked for (scripts/up, scripts/test)
_DEV_SECRET = "stencil-development-only-secret-key-change-me-0123456789abcdef"
SECRET_KEY = os.getenv("SECRET_KEY", _DEV_SECRET if DEBUG else "")
if not SECRET_KEY:
    raise RuntimeError("SECRET_KEY must be set when DEBUG is off "
                       "(for development on this machine: DEBUG=True)")
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")
SITE_ROOT = os.getenv("SITE_ROOT", "http://localhost:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "drafting",
    "audit",
    "corpora",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "stencil.urls"
WSGI_APPLICATION = "stencil.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "drafting.context_processors.stencil",
            ],
        },
    },
]

DATABASES = {
    "default": database_from_url(
        os.getenv("DATABASE_URL", f"sqlite:///{VAR_DIR / 'stencil.sqlite3'}"), base_dir=BASE_DIR
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
WHITENOISE_USE_FINDERS = DEBUG  # serve straight from the apps in development
# Until `collectstatic` has run (production does; development serves from the apps) WhiteNoise
# warns on every request that STATIC_ROOT does not exist: that is expected there.
warnings.filterwarnings("ignore", message="No directory at")
STATICFILES_DIRS = [BASE_DIR / "drafting" / "static"]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

# Production hardening: on whenever DEBUG is off (see README, "Deploying").
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", str(not DEBUG))
SESSION_COOKIE_SECURE = envbool("SESSION_COOKIE_SECURE", str(not DEBUG))
CSRF_COOKIE_SECURE = envbool("CSRF_COOKIE_SECURE", str(not DEBUG))
SECURE_HSTS_SECONDS = envint("SECURE_HSTS_SECONDS", "0" if DEBUG else "31536000")
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", "False")
# Joining the browsers' HSTS preload list binds the whole domain for months: that is the
# operator's decision (SECURE_HSTS_PRELOAD=True), so its reminder (W021) is silenced.
SILENCED_SYSTEM_CHECKS = ["security.W021"]
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_HTTPONLY = True
X_FRAME_OPTIONS = "DENY"

# -- Celery: the broker carries job ids only; the job row is the truth --------------------
BROKER_DIR = VAR_DIR / "broker"
CELERY_BROKER_URL = os.getenv("CELERY_BROKER_URL", "filesystem://")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if CELERY_BROKER_URL.startswith("filesystem://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(BROKER_DIR / "queue"),
        "data_folder_out": str(BROKER_DIR / "queue"),
        "processed_folder": str(BROKER_DIR / "processed"),
        "control_folder": str(BROKER_DIR / "control"),  # broadcasts (pidbox), not the cwd
        "store_processed": False,
    }
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = envint("STENCIL_TASK_SOFT_TIME_LIMIT", "300")
CELERY_TASK_TIME_LIMIT = envint("STENCIL_TASK_TIME_LIMIT", "360")
# Queue names carry an optional prefix so several deployments (or test runs) share a broker.
QUEUE_PREFIX = os.getenv("STENCIL_QUEUE_PREFIX", "")
QUEUE_DENOISE, QUEUE_AUDIT, QUEUE_TRAIN = (
    f"{QUEUE_PREFIX}{q}" for q in ("denoise", "audit", "train")
)
CELERY_TASK_DEFAULT_QUEUE = QUEUE_DENOISE
CELERY_TASK_ROUTES = {
    "gpu_worker.tasks.run_infill": {"queue": QUEUE_DENOISE},
    "audit.tasks.run_replay": {"queue": QUEUE_AUDIT},
    "research.tasks.finetune_run": {"queue": QUEUE_TRAIN},  # its own workers (docs/teach-stencil.md)
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# -- Stencil -------------------------------------------------------------------------------
MODELS_DIR = BASE_DIR / "models"
STENCIL_MODEL_DIR = Path(
    os.getenv(
        "STENCIL_MODEL_DIR",
        str(
            MODELS_DIR / "stencil-denoiser"
            if (MODELS_DIR / "stencil-denoiser" / "model.safetensors").exists()
            else MODELS_DIR / "stencil-placeholder"
        ),
    )
)
STENCIL_AR_MODEL_DIR = Path(os.getenv("STENCIL_AR_MODEL_DIR", str(MODELS_DIR / "stencil-ar-fim")))
STENCIL_DEVICE = os.getenv("STENCIL_DEVICE", "auto")  # auto = CUDA when present
STENCIL_TRUST_REMOTE_CODE = envbool("STENCIL_TRUST_REMOTE_CODE", "False")
STENCIL_MAX_QUEUED_JOBS = envint("STENCIL_MAX_QUEUED_JOBS", "200")
STENCIL_MAX_QUEUED_JOBS_PER_USER = envint("STENCIL_MAX_QUEUED_JOBS_PER_USER", "8")
STENCIL_MAX_ATTEMPTS = envint("STENCIL_MAX_ATTEMPTS", "3")  # retries before the AR fallback
STENCIL_MAX_DELIVERIES = envint("STENCIL_MAX_DELIVERIES", "3")  # poison-job cap
# The worker's sweeper: every STENCIL_SWEEP_SECONDS it re-sends jobs the broker never took
# (older than the grace) and jobs whose worker lost its lease (gpu_worker/sweeper.py).
# /metrics answers these client networks, or a request bearing STENCIL_METRICS_TOKEN.
STENCIL_METRICS_ALLOW = envlist("STENCIL_METRICS_ALLOW", "127.0.0.1/32,::1/128")
STENCIL_METRICS_TOKEN = os.getenv("STENCIL_METRICS_TOKEN", "")
STENCIL_SWEEP_SECONDS = envint("STENCIL_SWEEP_SECONDS", "15")
STENCIL_SWEEP_GRACE_SECONDS = envint("STENCIL_SWEEP_GRACE_SECONDS", "10")
STENCIL_BATCH_MAX = envint("STENCIL_BATCH_MAX", "8")  # jobs a worker denoises in one batch
STENCIL_JOB_LEASE_SECONDS = envint("STENCIL_JOB_LEASE_SECONDS", "30")  # renewed every step
STENCIL_MAX_REQUEST_TOKENS = envint("STENCIL_MAX_REQUEST_TOKENS", "1024")
STENCIL_MAX_REQUEST_STEPS = envint("STENCIL_MAX_REQUEST_STEPS", "512")
STENCIL_MAX_FIELD_LENGTH = envint("STENCIL_MAX_FIELD_LENGTH", "2000")
STENCIL_MAX_TEMPLATE_BYTES = envint("STENCIL_MAX_TEMPLATE_BYTES", "65536")
STENCIL_MAX_CANVAS_CHARS = envint("STENCIL_MAX_CANVAS_CHARS", "65536")  # locked text of a canvas
STENCIL_PROGRESS_EVERY = envint("STENCIL_PROGRESS_EVERY", "1")  # write progress every k steps
STENCIL_SHADOW_SHARE = envfloat("STENCIL_SHADOW_SHARE", "0.0")
# Fault injection for the failure-path tests: "violate:ROUTE" makes every attempt on ROUTE
# (diffusion | ar) fail validation with a named violation. Never allowed in production.
STENCIL_FAULT_INJECTION = envlist("STENCIL_FAULT_INJECTION", "")
if STENCIL_FAULT_INJECTION and not DEBUG:
    raise RuntimeError("STENCIL_FAULT_INJECTION is for tests; it cannot be set when DEBUG is off")

# -- Corpora and training (corpora/, research/finetune.py; docs/teach-stencil.md) ------------
STENCIL_CORPUS_MAX_FILE_BYTES = envint("STENCIL_CORPUS_MAX_FILE_BYTES", str(2 * 1024 * 1024))
STENCIL_CORPUS_MAX_UPLOAD_BYTES = envint("STENCIL_CORPUS_MAX_UPLOAD_BYTES", str(64 * 1024 * 1024))
STENCIL_CORPUS_MAX_FILES = envint("STENCIL_CORPUS_MAX_FILES", "20000")  # per upload, zips opened
# Trained model versions are written here, one directory per training run.
STENCIL_MODEL_VERSIONS_DIR = Path(
    os.getenv("STENCIL_MODEL_VERSIONS_DIR", str(VAR_DIR / "model-versions"))
)
STENCIL_TRAIN_DIR = Path(os.getenv("STENCIL_TRAIN_DIR", str(VAR_DIR / "train")))  # checkpoints
STENCIL_TRAIN_LEASE_SECONDS = envint("STENCIL_TRAIN_LEASE_SECONDS", "120")  # renewed every step
STENCIL_TRAIN_TIME_LIMIT = envint("STENCIL_TRAIN_TIME_LIMIT", str(3 * 3600))  # the task's hard cap

# -- Audit ---------------------------------------------------------------------------------
# Missing audit keys are generated into VAR_DIR/audit in development; in production (DEBUG
# off) they must come from the environment. Read once here: the test runner turns DEBUG off
# later, and generated development keys must keep working there.
AUDIT_DEV_KEYS = envbool("AUDIT_DEV_KEYS", str(DEBUG))
AUDIT_DIAGNOSTIC_SHARE = envfloat("AUDIT_DIAGNOSTIC_SHARE", "0.1")
AUDIT_ENCRYPTION_KEYS = envlist("AUDIT_ENCRYPTION_KEYS", "")  # newest first, base64 AES keys
AUDIT_SIGNING_KEY = os.getenv("AUDIT_SIGNING_KEY", "")  # base64 Ed25519 private key
AUDIT_CHECKPOINT_FILE = Path(
    os.getenv("AUDIT_CHECKPOINT_FILE", str(VAR_DIR / "audit" / "checkpoints.jsonl"))
)
# A copy of the newest signed checkpoint, kept where the database host cannot write (audit/witness.py).
AUDIT_CHECKPOINT_WITNESS = os.getenv("AUDIT_CHECKPOINT_WITNESS", "")
AUDIT_DIAGNOSTIC_RETENTION_DAYS = envint("AUDIT_DIAGNOSTIC_RETENTION_DAYS", "30")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
