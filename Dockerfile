# The truba image: scheduler, daemon and client tools. Handlers are added by deriving from it.
FROM python:3.11-slim
WORKDIR /opt/truba
COPY pyproject.toml README.md ./
COPY core core
COPY scheduler scheduler
COPY daemon daemon
COPY pipes pipes
COPY client client
COPY proto proto
COPY examples examples
RUN pip install --no-cache-dir . && useradd --system --create-home truba
USER truba
WORKDIR /home/truba
ENV PYTHONPATH=/opt/truba
ENTRYPOINT ["truba"]
