# The leafpool image: the library, the Celery workers (`celery -A workers ...`), Flower and
# the HTTP service (`leafpool serve`). docker-compose.yml runs every role from it.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LEAFPOOL_HOME=/var/lib/leafpool

WORKDIR /src
COPY pyproject.toml README.md ./
COPY leafpool ./leafpool
COPY workers ./workers

# PyMySQL[rsa]: MySQL 8's default caching_sha2_password needs RSA without TLS
RUN pip install ".[monitor]" "PyMySQL[rsa]" \
    && useradd --system --uid 10001 --create-home --home-dir /var/lib/leafpool leafpool

USER leafpool
WORKDIR /var/lib/leafpool
EXPOSE 8080 5555
CMD ["leafpool", "serve"]
