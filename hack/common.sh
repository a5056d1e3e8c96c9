# Shared by provision.sh and peers.sh: the pinned versions, the cache, Go settings, Maven resolution.
# The caller sets LOG_TAG and its own shell options, then sources this file.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
CACHE=${CHSINK_CACHE:-$HOME/.cache/chsink}
mkdir -p "$CACHE"
export GOFLAGS=-mod=mod GOTOOLCHAIN=local

log() { printf '[%s] %s\n' "${LOG_TAG:-chsink}" "$*" >&2; }

# maven_copy DEST GROUP:ARTIFACT:VERSION...: resolves artifacts and their runtime dependencies
# from Maven Central into DEST with a throw-away pom.
maven_copy() {
  local dest=$1; shift
  local work; work=$(mktemp -d)
  {
    echo '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
    echo '<groupId>chsink</groupId><artifactId>testbed</artifactId><version>1</version><dependencies>'
    for coord in "$@"; do
      IFS=: read -r g a v <<<"$coord"
      echo "<dependency><groupId>$g</groupId><artifactId>$a</artifactId><version>$v</version></dependency>"
    done
    echo '</dependencies></project>'
  } >"$work/pom.xml"
  mkdir -p "$dest.tmp"
  mvn -q -B -s "$here/maven-settings.xml" -f "$work/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$dest.tmp" >"$work/mvn.log" 2>&1 || { tail -30 "$work/mvn.log"; return 1; }
  mv "$dest.tmp" "$dest"
  rm -rf "$work"
}
