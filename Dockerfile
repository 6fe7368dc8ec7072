# The truba image: scheduler, daemon and client tools, with truba and its examples installed as
# packages (no source folder on PYTHONPATH: a handler's `import pipes` gets the standard library's,
# never truba's folder). Add handlers by deriving from it and pip-installing their package.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
COPY scheduler scheduler
COPY daemon daemon
COPY pipes pipes
COPY client client
COPY proto proto
COPY examples examples
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . ./examples

FROM python:3.11-slim
COPY --from=build /wheels /wheels
# The postgresql extra: `truba scheduler --store postgresql://...` works in the image too.
RUN pip install --no-cache-dir /wheels/truba_examples-*.whl "$(ls /wheels/truba-*.whl)[postgresql]" \
    && rm -rf /wheels && useradd --system --create-home truba
USER truba
WORKDIR /home/truba
ENTRYPOINT ["truba"]
