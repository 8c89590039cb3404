# realsim: the two quick-start commands (each installs what it needs first).
#   make demo   - synthesise an ALOHA 2 recording and feed it to the node over ROS 2
#   make test   - the whole test suite (what CI runs)
SHELL := /bin/bash
ENV := ./scripts/with-env
PYTEST_ARGS ?=

.PHONY: install demo test lint bench clean
install:
	@./scripts/install.sh

demo: install
	@$(ENV) python -m realsim_ros.demo

test: install
	@$(ENV) python -m pytest $(PYTEST_ARGS)

lint: install
	@$(ENV) ruff check .

bench: install
	@$(ENV) realsim bench

clean:
	rm -rf build ros2_ws/build ros2_ws/install ros2_ws/log
