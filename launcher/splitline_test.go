package launcher

import (
	"fmt"
	"strings"
	"testing"
)

// TestLinesNotSplitByStaleTimer: a line that a worker writes in pieces
// (python -u's print writes each argument and the newline apart) and
// ends well within partialDelay reaches the console whole, while another
// rank's lines stream beside it. The timer that shows a partial line must
// time that line, not one ended long ago: else, every partialDelay, the
// line partial at that moment was shown unfinished and cut in two by the
// other rank's next line ("[0]: line 3", "[1]: tick", "[0]:  end").
func TestLinesNotSplitByStaleTimer(t *testing.T) {
	const lines = 40
	// Both ranks wait with bash's builtin read on a FIFO that never has
	// data: no process started per wait, whose start could take longer
	// than partialDelay on a loaded machine (rank 0's 20 ms), or thin
	// out rank 1's lines between rank 0's pieces.
	script := fmt.Sprintf(`exec bash -c 'f=$(mktemp -u); mkfifo "$f"; exec 3<>"$f"; rm "$f"
if [ $RANK = 0 ]; then
  i=0; while [ $i -lt %d ]; do printf "line %%d" $i; read -t 0.02 -u 3; printf " end\n"; i=$((i+1)); done
else
  i=0; while [ $i -lt 400 ]; do echo tick; read -t 0.003 -u 3; i=$((i+1)); done
fi'`, lines)
	out, _, err := run(t, Config{NProcPerNode: 2}, script)
	if err != nil {
		t.Fatal(err)
	}
	var split []string
	for i := range lines {
		if !strings.Contains(out, fmt.Sprintf("[0]: line %d end\n", i)) {
			split = append(split, fmt.Sprint(i))
		}
	}
	if len(split) > 0 {
		t.Errorf("rank 0's lines %s (of %d, each ended 20 ms after its start) were cut in two on the console:\n%s", strings.Join(split, ","), lines, out)
	}
}
