# upager: install and test the C and Python faces.
#
#   make install-c [PREFIX=DIR]   C library and headers into DIR (default ./out/c;
#                                 never the system unless you say so)
#   make test-c                   install into a scratch prefix, build the C tests
#                                 against it with gcc, run them
#   make python                   build the Python package's wheel (maturin, into
#                                 $(CARGO_TARGET_DIR)/wheels) and pip install it,
#                                 with its test tools, into whichever python3 is
#                                 first on PATH (PYTHON=... for another)
#   make test-python              run its pytest suite
#   make wheels                   manylinux wheels (glibc >= 2.34) for each CPython
#                                 3.9-3.13 found, into $(CARGO_TARGET_DIR)/wheels/dist
#
# Cargo builds go to $(CARGO_TARGET_DIR) (default ./target).

CARGO            ?= cargo
PYTHON           ?= python3
PREFIX           ?= out/c
CARGO_TARGET_DIR ?= $(CURDIR)/target
export CARGO_TARGET_DIR

ABS_PREFIX := $(abspath $(PREFIX))
VERSION    := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)
REL        := $(CARGO_TARGET_DIR)/release
# From `rustc --print native-static-libs` for a std staticlib on Linux.
# Without its -lgcc_s: the compiler driver adds the unwinder itself (libgcc_s,
# or libgcc_eh with -static, where -lgcc_s cannot link: there is no static
# libgcc_s).
STATIC_LIBS := -lutil -lrt -lpthread -lm -ldl -lc
TEST_PREFIX ?= $(CARGO_TARGET_DIR)/c-test-prefix

.PHONY: all install-c test-c python test-python test-python-s3 wheels

all: install-c

install-c:
	$(CARGO) build --release -p upager-capi
	install -d "$(ABS_PREFIX)/include/umap" "$(ABS_PREFIX)/lib/pkgconfig"
	install -m 644 crates/capi/include/upager.h "$(ABS_PREFIX)/include/upager.h"
	install -m 644 crates/capi/include/umap/umap.h "$(ABS_PREFIX)/include/umap/umap.h"
	install -d "$(ABS_PREFIX)/include/umap/store"
	install -m 644 crates/capi/include/umap/store/Store.hpp crates/capi/include/umap/store/SparseStore.h \
	    "$(ABS_PREFIX)/include/umap/store/"
	install -m 755 "$(REL)/libupager.so" "$(ABS_PREFIX)/lib/libupager.so.$(VERSION)"
	ln -sfn "libupager.so.$(VERSION)" "$(ABS_PREFIX)/lib/libupager.so.0"
	ln -sfn "libupager.so.0" "$(ABS_PREFIX)/lib/libupager.so"
	ln -sfn "libupager.so.0" "$(ABS_PREFIX)/lib/libumap.so"
	install -m 644 "$(REL)/libupager.a" "$(ABS_PREFIX)/lib/libupager.a"
	ln -sfn "libupager.a" "$(ABS_PREFIX)/lib/libumap.a"
	sed -e 's|@PREFIX@|$(ABS_PREFIX)|g' -e 's|@VERSION@|$(VERSION)|g' \
	    -e 's|@STATIC_LIBS@|$(STATIC_LIBS)|g' \
	    crates/capi/upager.pc.in > "$(ABS_PREFIX)/lib/pkgconfig/upager.pc"
	@echo "installed upager $(VERSION) C library into $(ABS_PREFIX)"

test-c:
	$(MAKE) --no-print-directory install-c PREFIX="$(TEST_PREFIX)"
	sh crates/capi/tests/run.sh "$(TEST_PREFIX)"

WHEEL_DIR := $(CARGO_TARGET_DIR)/wheels

# The wheel is kept: python/tests/test_packaging.py checks its contents.
python:
	$(PYTHON) -m pip install -r python/requirements-dev.txt
	rm -f "$(WHEEL_DIR)"/upager-*.whl
	$(PYTHON) -m pip wheel --no-deps -w "$(WHEEL_DIR)" ./python
	$(PYTHON) -m pip install --force-reinstall --no-deps "$(WHEEL_DIR)"/upager-*.whl

test-python:
	$(PYTHON) -m pytest -q python/tests

# The Python and C faces on a local SeaweedFS (needs the weed binary and
# the release CLI; scripts/test.sh runs it in its S3 step).
test-python-s3:
	$(MAKE) --no-print-directory install-c PREFIX="$(TEST_PREFIX)"
	UPAGER_TEST_S3=1 UPAGER_C_PREFIX="$(abspath $(TEST_PREFIX))" $(PYTHON) -m pytest -q python/tests/test_s3.py

wheels:
	$(PYTHON) -m pip install -r python/requirements-dev.txt
	bash scripts/build-wheels.sh
